"""Positions as the released code has them: its absolute_position and relative_position flags
are independent (the absolute table joins the unary atoms, the relative embedding starts the
binary stream). position="ape+rpe" is both, checked against an independent float64 reference
of the released encoder (tests/released_reference.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from paths import OFFICIAL as PREFIX
from released_reference import released_forward
from tolerances import assert_rel, assert_stored, rel_error

import folnet

FIELDS = ("sequence_output", "pooled_output", "relation_output", "mlm_logits", "nsp_logits")


def _released():
    sd = torch.load(str(PREFIX) + ".pt", weights_only=True)
    cfg = json.loads(Path(str(PREFIX) + ".cfg").read_text())
    return sd, cfg


@pytest.mark.numerics
def test_the_reference_reproduces_the_released_code():
    """The reference is right: on the fixture made by the released code (RPE only) it gives
    that code's outputs (row 0, the released run was float32)."""
    sd, cfg = _released()
    ref = torch.load(str(PREFIX) + ".reference.pt", weights_only=True)
    out = released_forward(sd, cfg, ref["input_ids"][:1], ref["token_type_ids"][:1])
    for name in FIELDS:
        assert_stored(out[name], ref[name][:1], name)


@pytest.fixture(scope="module")
def ape_rpe(tmp_path_factory):
    """A released-format checkpoint with both absolute_position and relative_position on."""
    sd, cfg = _released()
    g = torch.Generator().manual_seed(0)
    sd = dict(sd)
    sd["folnet.encoder.abs_pos_embd.weight"] = torch.randn(512, 64, generator=g) * 0.5
    cfg["absolute_position"] = True
    prefix = tmp_path_factory.mktemp("released") / "tiny-ape-rpe"
    torch.save(sd, str(prefix) + ".pt")
    Path(str(prefix) + ".cfg").write_text(json.dumps(cfg))
    ids = torch.randint(5, 1008, (2, 10), generator=g)
    types = torch.zeros_like(ids)
    types[:, 6:] = 1
    return prefix, sd, cfg, ids, types


@pytest.mark.numerics
def test_ape_and_rpe_checkpoint_matches_the_reference(ape_rpe):
    prefix, sd, cfg, ids, types = ape_rpe
    model = folnet.load_official(prefix)
    assert model.cfg.position == "ape+rpe" and model.head == "pretraining"
    want = released_forward(sd, cfg, ids, types)
    with torch.no_grad():
        out32 = model(ids, types, output_relations=True)
        out64 = model.double()(ids, types, output_relations=True)
    for name in FIELDS:
        assert_rel(getattr(out64, name), want[name], 1e-10, f"float64 {name}")
        assert_rel(getattr(out32, name), want[name], 1e-5, f"float32 {name}")
    # both tables matter: without the absolute one the outputs move
    sd_no_ape = {k: v for k, v in sd.items() if "abs_pos" not in k}
    plain = released_forward(sd_no_ape, {**cfg, "absolute_position": False}, ids, types)
    assert rel_error(plain["sequence_output"], want["sequence_output"]) > 1e-2


def test_ape_and_rpe_round_trips_through_our_format(ape_rpe, tmp_path):
    prefix, _sd, _cfg, ids, types = ape_rpe
    model = folnet.load_official(prefix)
    model.save_pretrained(tmp_path / "ours")
    loaded = folnet.from_pretrained(tmp_path / "ours").eval()
    assert loaded.cfg.position == "ape+rpe"
    with torch.no_grad():
        assert torch.equal(loaded(ids, types).sequence_output, model(ids, types).sequence_output)


def test_ape_and_rpe_builds_with_both_tables():
    """Base size, j.a, D2 12: the released APE count plus the relative table (130 x 12)."""
    with torch.device("meta"):
        model = folnet.build_model("j.a", preset="base", vocab_size=30522, D2=12,
                                   position="ape+rpe")
    assert sum(p.numel() for p in model.parameters()) == 109_567_728 + 130 * 12
    atoms = model.encoder.atoms
    assert atoms.absolute.weight.shape == (512, 768) and atoms.relative.weight.shape == (130, 12)


def test_relative_ids_from_the_kept_squares_are_the_computed_ones():
    """Without padding a step's relative ids come from two squares made once per length (one
    comparison of the segments, one select); they equal the ids computed from positions."""
    from folnet.arch.layer.atoms import relative_position_ids

    g = torch.Generator().manual_seed(0)
    for T, delta in ((1, 4), (7, 3), (19, 8)):
        types = torch.randint(0, 2, (3, T), generator=g)
        kept = relative_position_ids(types, delta)
        computed = relative_position_ids(types, delta, torch.arange(T)[None])
        assert torch.equal(kept, computed) and kept.shape == (3, T, T)
        assert torch.equal(relative_position_ids(types, delta), kept)  # from the cache
