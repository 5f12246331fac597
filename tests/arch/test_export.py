"""A forward that never waits on the host: value checks only where they are free (CPU) or
asked for, no branch on tensor values; torch.export of the encoder with dynamic batch and
length matches eager; einsum_by_path (what traced graphs run) equals torch.einsum."""

from __future__ import annotations

import pytest
import torch
from models import tiny_model
from tolerances import assert_close
from torch.overrides import TorchFunctionMode

from folnet.ops.backends.fused import einsum_by_path, terms
from folnet.ops.registry import get_operator

V = 100
HOST_READS = {torch.Tensor.item, torch.Tensor.tolist, torch.Tensor.__bool__,
              torch.Tensor.__int__, torch.Tensor.__float__, torch.Tensor.__index__,
              torch.Tensor.numpy}


class HostReads(TorchFunctionMode):
    """Counts the calls that copy a tensor's value to the host (a device sync on CUDA)."""

    def __init__(self):
        super().__init__()
        self.calls: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in HOST_READS:
            self.calls.append(getattr(func, "__name__", str(func)))
        return func(*args, **(kwargs or {}))


def _model(kind="encoder", **kw):  # relation_output is compared too
    return tiny_model("jmc.atp", kind, vocab_size=V, dropout=None, eval_mode=True,
                      relations=True, **kw)


def _inputs(B=3, T=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, V, (B, T), generator=g)
    mask = torch.ones_like(ids)
    mask[-1, T - 3:] = 0
    return ids, mask


@pytest.mark.parametrize("kind", ["encoder", "decoder", "encoder-decoder"])
def test_no_host_reads_unless_values_are_checked(kind):
    model = _model(kind, **({"head": "classification", "num_labels": 3}
                            if kind == "encoder" else {}))
    ids, mask = _inputs()
    args = (ids, ids[:, :5]) if kind == "encoder-decoder" else (ids,)
    with torch.no_grad():
        with HostReads() as checked:  # CPU, validate None: the value checks read the host
            model(*args, attention_mask=mask)
        model.validate = False
        with HostReads() as silent:
            model(*args, attention_mask=mask)
    assert checked.calls and not silent.calls, silent.calls


@pytest.mark.parametrize("kind", ["encoder", "decoder"])
def test_meta_tensors_run_the_whole_forward(kind):
    """On the meta device no value exists: any host read or value-dependent branch fails.
    Off the CPU, values are not checked unless asked for."""
    with torch.device("meta"):
        model = _model(kind)
        ids = torch.zeros(2, 9, dtype=torch.long)
        out = model(ids, attention_mask=torch.ones_like(ids))
    assert out[0].device.type == "meta"
    model.validate = True
    with pytest.raises(RuntimeError):  # asking for value checks on meta reads values
        model(ids.to("meta"))


def test_a_given_mask_is_applied_whatever_its_values():
    model = _model(head="classification", num_labels=3)
    ids, _ = _inputs()
    ones = torch.ones_like(ids)
    with torch.no_grad():
        a = model(ids).logits
        b = model(ids, attention_mask=ones).logits
    assert torch.equal(a, b)  # all ones masks nothing: the same outputs, one code path


@pytest.mark.slow
@pytest.mark.numerics
@pytest.mark.parametrize("masked", [False, True])
def test_export_with_dynamic_batch_and_length_matches_eager(masked):
    model = _model(head="classification", num_labels=3)
    ids, mask = _inputs()
    batch = torch.export.Dim("batch", min=1, max=64)
    length = torch.export.Dim("length", min=2, max=256)
    kwargs = {"input_ids": ids, **({"attention_mask": mask} if masked else {})}
    shapes = {k: {0: batch, 1: length} for k in kwargs}
    program = torch.export.export(model, (), kwargs, dynamic_shapes=shapes)
    for B, T in ((3, 12), (5, 20), (1, 7)):
        new, new_mask = _inputs(B, T, seed=B)
        call = {"input_ids": new, **({"attention_mask": new_mask} if masked else {})}
        with torch.no_grad():
            got, want = program.module()(**call), model(**call)
        for field in ("logits", "sequence_output", "pooled_output", "relation_output"):
            # the exported graph's contraction order against the eager fused path's
            assert_close(got[field], want[field], rtol=1e-5, atol=1e-5,
                         what=f"exported {field}, batch {B}, length {T}")


@pytest.mark.numerics
@pytest.mark.parametrize("symbol", ["c", "m", "p", "t"])
def test_einsum_by_path_equals_torch_einsum(symbol):
    spec = get_operator(symbol)
    g = torch.Generator().manual_seed(4)
    for term in terms(spec, (False, True), (False, True)):
        subs = term.equation.split("->")[0].split(",")
        sizes = {c: 2 + i for i, c in enumerate(sorted(set("".join(subs))))}
        args = [torch.randn(*(sizes[c] for c in s), generator=g, dtype=torch.float64)
                for s in subs]
        assert_close(einsum_by_path(term.equation, *args), torch.einsum(term.equation, *args),
                     rtol=1e-12, atol=1e-12, what=term.equation)


@pytest.mark.slow
@pytest.mark.numerics
@pytest.mark.parametrize("case", ["causal", "prefix", "encoder-decoder"])
def test_text_models_export_with_dynamic_batch_and_length_twice(case):
    """torch.export of the decoder (causal and PrefixLM) and the encoder-decoder with dynamic
    batch and lengths matches eager; a second export in the same process works too (no traced
    tensor left in a cache: the causal mask was one)."""
    kind = "encoder-decoder" if case == "encoder-decoder" else "decoder"
    model = _model(kind)
    ids, mask = _inputs()
    batch = torch.export.Dim("batch", min=1, max=64)
    length = torch.export.Dim("length", min=2, max=256)
    kwargs = {"input_ids": ids, "attention_mask": mask}
    shapes = {"input_ids": {0: batch, 1: length}, "attention_mask": {0: batch, 1: length}}
    if case == "prefix":
        kwargs["prefix_lengths"] = torch.tensor([4, 2, 5])
        shapes["prefix_lengths"] = {0: batch}
    if kind == "encoder-decoder":
        kwargs["decoder_input_ids"] = ids[:, :5].clone()  # contiguous, as a batch is
        shapes["decoder_input_ids"] = {0: batch, 1: torch.export.Dim("targets", min=2, max=256)}
    twice = 2 if case == "causal" else 1  # (each export takes ~5 s here)
    programs = [torch.export.export(model, (), kwargs, dynamic_shapes=shapes)
                for _ in range(twice)]
    for B, T in ((2, 7), (4, 19)):
        new, new_mask = _inputs(B, T, seed=T)
        call = {"input_ids": new, "attention_mask": new_mask}
        if case == "prefix":
            call["prefix_lengths"] = torch.arange(B) + 2
        if kind == "encoder-decoder":
            call["decoder_input_ids"] = new[:, : T - 2]
        with torch.no_grad():
            want = model(**call)
            for program in programs:
                got = program.module()(**call)
                for field in ("logits", "sequence_output", "relation_output"):
                    assert_close(got[field], want[field], rtol=1e-5, atol=1e-5,
                                 what=f"exported {case} {field}, batch {B}, length {T}")
