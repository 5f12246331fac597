"""The released-format fixture reproduces its reference outputs (stored by the released code on
another machine: compared at tests/tolerances.py's STORED_REL); conversion; parameter counts."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from paths import OFFICIAL as PREFIX
from tolerances import assert_rel, assert_stored

import folnet
from folnet.cli import main as cli_main

# PREFIX, tests/fixtures/official: a copy of ../shared/fixtures/official (made by the released
# FOLNet code) kept in the repository so that a clean clone tests against it.


@pytest.fixture(scope="module")
def reference():
    if not Path(str(PREFIX) + ".pt").is_file():
        pytest.fail(f"the released-format fixture is missing at {PREFIX}")
    return torch.load(str(PREFIX) + ".reference.pt", weights_only=True)


def _check(model, reference):
    with torch.no_grad():
        out = model(reference["input_ids"], reference["token_type_ids"], output_relations=True)
    for name, got in (("sequence_output", out.sequence_output),
                      ("pooled_output", out.pooled_output),
                      ("relation_output", out.relation_output),
                      ("mlm_logits", out.mlm_logits), ("nsp_logits", out.nsp_logits)):
        assert_stored(got, reference[name], name)  # the README claim


@pytest.mark.numerics
def test_official_fixture_reproduces_reference_outputs(reference):
    model = folnet.load_official(PREFIX)
    assert str(model.plan) == "jmc.atp" and model.head == "pretraining"
    _check(model, reference)


@pytest.mark.numerics
@pytest.mark.parametrize("block_rows", [1, 5])
def test_fixture_matches_in_row_blocks(reference, block_rows):
    """The row-blocked layers (mixer and binary FFN, `folnet.set_memory`) reproduce the
    released outputs too, whatever the block size (the fixture's T is not a multiple of 5)."""
    model = folnet.set_memory(folnet.load_official(PREFIX), "blocked", block_rows=block_rows)
    assert reference["input_ids"].shape[1] % 5 != 0
    _check(model, reference)


@pytest.mark.numerics
@pytest.mark.parametrize("backend", ["fused", "einsum"])
def test_fixture_matches_on_every_cpu_backend(reference, backend):
    model = folnet.load_official(PREFIX, backend=backend)
    layer = model.encoder.layers[0]
    call = layer.ops[0].describe_call(torch.zeros(1), padded=False, requires_grad=False)
    assert {op.select(call).name for op in layer.ops} == {backend}  # chosen by the argument
    _check(model, reference)


@pytest.mark.numerics
def test_fixture_matches_with_sdpa_where_it_applies(reference):
    """SDPA runs the attention-shaped operators (j, m, c, t); a and p have no attention shape,
    so a model forcing sdpa alone fails when it is built. A priority list ("sdpa,fused") gives
    SDPA every operator it can run and the fused path the rest."""
    with pytest.raises(folnet.FolnetError, match=r"'a' cannot run on backend 'sdpa'"):
        folnet.load_official(PREFIX, backend="sdpa")
    model = folnet.load_official(PREFIX, backend="sdpa,fused")
    call = model.encoder.layers[0].ops[0].describe_call(torch.zeros(1), padded=False,
                                                        requires_grad=False)
    chosen = {op.spec.symbol: op.select(call).name for op in model.encoder.layers[0].ops}
    assert chosen == {"j": "sdpa", "m": "sdpa", "c": "sdpa", "a": "fused", "p": "fused",
                      "t": "sdpa"}
    _check(model, reference)


@pytest.mark.numerics
def test_padding_mask_all_ones_is_the_released_computation(reference):
    model = folnet.load_official(PREFIX)
    ids, types = reference["input_ids"], reference["token_type_ids"]
    with torch.no_grad():
        a = model(ids, types).sequence_output
        b = model(ids, types, attention_mask=torch.ones_like(ids)).sequence_output
    assert torch.equal(a, b)


@pytest.mark.numerics
def test_a_padded_row_is_the_released_computation_of_its_real_tokens(reference):
    """What the all-ones mask above cannot see: a row padded with other tokens behind a mask
    gives, at its real positions, what the independent float64 reference of the released code
    computes for those tokens alone (tests/released_reference.py)."""
    import json

    from released_reference import released_forward

    sd = torch.load(str(PREFIX) + ".pt", weights_only=True)
    cfg = json.loads(Path(str(PREFIX) + ".cfg").read_text())
    model = folnet.load_official(PREFIX).double()
    ids, types = reference["input_ids"][:2].clone(), reference["token_type_ids"][:2]
    real = 7
    g = torch.Generator().manual_seed(3)
    ids[0, real:] = torch.randint(5, 900, (ids.shape[1] - real,), generator=g)  # not zeros
    mask = torch.ones_like(ids)
    mask[0, real:] = 0
    want = released_forward(sd, cfg, ids[:1, :real], types[:1, :real])
    with torch.no_grad():
        got = model(ids, types, attention_mask=mask, output_relations=True)
    assert_rel(got.sequence_output[0, :real], want["sequence_output"][0], 1e-10,
               "padded row's sequence_output")
    assert_rel(got.relation_output[0, :real, :real], want["relation_output"][0], 1e-10,
               "padded row's relation_output")
    assert_rel(got.pooled_output[0], want["pooled_output"][0], 1e-10, "padded row's pooled")


@pytest.mark.numerics
def test_convert_cli_round_trip(reference, tmp_path, capsys):
    assert cli_main(["convert", str(PREFIX), str(tmp_path / "conv")]) == 0
    assert "jmc.atp" in capsys.readouterr().out
    model = folnet.from_pretrained(tmp_path / "conv").eval()
    _check(model, reference)


def test_official_errors_name_the_keys(tmp_path):
    sd = torch.load(str(PREFIX) + ".pt", weights_only=True)
    cfg = (str(PREFIX) + ".cfg")
    bad = tmp_path / "bad"
    (tmp_path / "bad.cfg").write_text(Path(cfg).read_text())
    broken = dict(sd)
    broken.pop("folnet.reasoner.layers.1.deducers.0.operators.2.1.writer.bias")
    broken["folnet.extra.weight"] = torch.zeros(1)
    torch.save(broken, str(bad) + ".pt")
    with pytest.raises(folnet.FolnetError,
                       match=r"missing key 'folnet\.reasoner\.layers\.1\.deducers\.0\.operators"
                             r"\.2\.1\.writer\.bias'"):
        folnet.load_official(bad)
    broken = dict(sd)
    broken["folnet.extra.weight"] = torch.zeros(1)
    torch.save(broken, str(bad) + ".pt")
    with pytest.raises(folnet.FolnetError, match=r"unknown or unused key\(s\) "
                                                 r"\['folnet\.extra\.weight'\]"):
        folnet.load_official(bad)
    broken = dict(sd)
    broken["folnet.dense.weight"] = torch.zeros(3, 3)
    torch.save(broken, str(bad) + ".pt")
    with pytest.raises(folnet.FolnetError, match=r"'folnet\.dense\.weight' has shape \(3, 3\), "
                                                 r"expected \(64, 64\)"):
        folnet.load_official(bad)
    with pytest.raises(folnet.FolnetError, match="does not exist"):
        folnet.load_official(tmp_path / "nothing")


ROWS = [  # docs/design.md section 3: released encoder parameter counts, base size, vocab 30522
    ("j.a", 12, "ape", 109_567_728),
    ("j.a", 12, "rpe", 109_176_072),
    ("jm.ap", 12, "rpe", 123_373_080),
    ("j.a", 16, "rpe", 109_216_096),
    ("j.a", 32, "rpe", 109_380_032),
    ("j.a", 64, "rpe", 109_726_336),
    ("j.at", 64, "rpe", 109_874_560),
    ("j.atp", 64, "rpe", 117_021_568),
    ("jm.atp", 64, "rpe", 124_167_040),
    ("jmc.atp", 64, "rpe", 138_381_952),
    ("jmc.atp", 12, "rpe", 137_553_384),
]


@pytest.mark.parametrize(("ops", "d2", "position", "released"), ROWS)
def test_parameter_counts_match_released(ops, d2, position, released):
    with torch.device("meta"):
        model = folnet.build_model(ops, preset="base", vocab_size=30522, D2=d2,
                                   position=position)
    count = sum(p.numel() for p in model.parameters())
    assert count == released
