"""torch.func (functorch) through folnet -- ``grad`` (influence functions), ``vmap(grad)``
(per-sample gradients), ``jacrev`` -- on every kernel's autograd Function and on whole models,
beside a tiny BERT doing the same calls in the same test.

References are independent computations: a kernel's transforms against eager autograd through a
plain-torch formula of it; a model's against its own eager ``.backward()`` (one batch, or a
Python loop of one-row batches for per-sample gradients) and against central finite
differences. Everything is float64 (measured at most 6e-16 on both kernel sets: `F64` leaves
over 1000x), but for one float32 check of the oneDNN path.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F
from tolerances import assert_rel
from torch.func import functional_call, grad, jacrev, vmap

import folnet
from folnet.errors import FolnetError
from folnet.ops.primitives.dropout import _DropoutAdd, _MaskedScale
from folnet.ops.primitives.ffn import _BinaryFFN
from folnet.ops.primitives.linear import _Linear, _SegmentedLinear, linear
from folnet.ops.primitives.recompute import Slab, recompute_blocks
from folnet.ops.primitives.sink import _SinkEinsum

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.numerics,
              # BERT's SDPA under vmap: torch has no batching rule for the CPU flash kernel
              pytest.mark.filterwarnings("ignore:There is a performance drop")]

F64 = 1e-12  # float64 against float64 (measured < 1e-15)
B = 4  # sequences (or kernel samples) per batch


def _randn(*shape, seed: int, dtype=torch.float64) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def _flat(grads: dict[str, torch.Tensor]) -> torch.Tensor:
    """A model's gradients as one vector (by name): compared as a whole, since some are zero
    up to rounding (BERT's key biases, to which the softmax is invariant)."""
    return torch.cat([grads[k].flatten() for k in sorted(grads)])


def _close(got, want, bound: float, what: str) -> None:
    """Tensors, or (nested) tuples / dicts of them, all within ``bound`` (relative, in norm)."""
    if isinstance(want, dict):
        for k in want:
            _close(got[k], want[k], bound, f"{what}[{k}]")
    elif isinstance(want, (tuple, list)):
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            _close(g, w, bound, f"{what}[{i}]")
    else:
        assert_rel(got, want, bound, what)


# -- every autograd Function, alone -----------------------------------------------------------


@dataclass
class Case:
    """``fn(data, weights)`` (the kernel) and ``ref`` (plain torch) over per-sample ``data``
    (leading dim B: the float ones differentiated, the rest masks) and shared ``weights``."""

    fn: object
    ref: object
    data: list
    weights: list


def _ffn(n, w, keep=None, scale=1.0):
    """The binary FFN in plain torch: W_o gelu(W_i [n, n^T] + b_i) + b_o + W_s n^T + b_s."""
    nt = n.transpose(1, 2)
    out = F.linear(F.gelu(F.linear(torch.cat([n, nt], -1), w[0], w[1])), w[2], w[3]) \
        + F.linear(nt, w[4], w[5])
    return out if keep is None else out * keep * scale


def _cases() -> dict[str, Case]:
    x, T, D = _randn(B, 5, 5, 6, seed=1), 5, 6
    keep = _randn(B, T, T, D, seed=2) > -0.5
    w, b = _randn(11, D, seed=3), _randn(11, seed=4)
    ffn_w = [_randn(*s, seed=10 + i) for i, s in
             enumerate([(8, 2 * D), (8,), (D, 8), (D,), (D, D), (D,)])]
    segs = ((0, 3, "cl"), (3, 4, "cf"), (9, 2, "cl"))  # rows 7:9 unread: a zero gradient

    def rows(d, ws):  # three blocks of 2, 2 and 1 rows, recomputed in eager backward
        run = lambda blk: {"y": torch.tanh(blk.slabs["r"] @ ws[0])}  # noqa: E731
        return recompute_blocks(run, [(0, 2), (2, 4), (4, 5)], {"x": d[0]}, [ws[0]],
                                {"r": Slab("x", 1)})["y"]

    return {
        "masked_scale": Case(lambda d, ws: _MaskedScale.apply(d[0], d[1], 1.25),
                             lambda d, ws: d[0] * d[1] * 1.25, [x, keep], []),
        "dropout_add": Case(lambda d, ws: _DropoutAdd.apply(d[0], d[1], d[2], 2.0),
                            lambda d, ws: d[0] + d[1] * d[2] * 2.0,
                            [x, _randn(B, T, T, D, seed=5), keep], []),
        "linear": Case(lambda d, ws: _Linear.apply(d[0], *ws),
                       lambda d, ws: F.linear(d[0], *ws), [x], [w, b]),
        "segmented_linear": Case(
            lambda d, ws: _SegmentedLinear.apply(d[0], *ws, segs),
            lambda d, ws: tuple(F.linear(d[0], ws[0][s : s + n], ws[1][s : s + n]).movedim(
                -1, 1 if lay == "cf" else -1) for s, n, lay in segs), [x], [w, b]),
        "binary_ffn": Case(lambda d, ws: _BinaryFFN.apply(d[0], *ws, None, None, 1.0, None,
                                                          None)[0],
                           lambda d, ws: _ffn(d[0], ws), [x], ffn_w),
        "binary_ffn_rows": Case(
            lambda d, ws: _BinaryFFN.apply(d[0], *ws, 2, d[1], 1.25, None, None)[0],
            lambda d, ws: _ffn(d[0], ws, d[1], 1.25), [x, keep], ffn_w),
        "binary_ffn_rows_normalising": Case(  # each block's LayerNorm, by hand in the backward
            lambda d, ws: _BinaryFFN.apply(d[0], *ws, 2, d[1], 1.25, 1e-5, None)[0],
            lambda d, ws: _ffn(F.layer_norm(d[0], (D,), eps=1e-5), ws, d[1], 1.25), [x, keep],
            ffn_w),
        "sink_einsum": Case(
            lambda d, ws: _SinkEinsum.apply("bxa,bay->bxy", d[0], d[1], None, None),
            lambda d, ws: torch.einsum("bxa,bay->bxy", d[0], d[1]),
            [_randn(B, 4, 3, seed=6), _randn(B, 3, 5, seed=7)], []),
        "recompute_blocks": Case(rows, lambda d, ws: torch.tanh(d[0] @ ws[0]), [x],
                                 [_randn(D, 3, seed=8)]),
    }


def _loss(fn, data, weights, probes):
    """A scalar reading every output: sum(out_i * probe_i)."""
    out = fn(data, weights)
    outs = out if isinstance(out, tuple) else (out,)
    return sum((o * p).sum() for o, p in zip(outs, probes, strict=True))


def _eager_grads(case: Case, data, probes):
    """Gradients of the plain formula's loss towards the float data and the weights."""
    diff = [t.clone().requires_grad_() if t.is_floating_point() else t for t in data]
    weights = [t.clone().requires_grad_() for t in case.weights]
    loss = _loss(case.ref, diff, weights, probes)
    wrt = [t for t in diff if t.is_floating_point()] + weights
    return torch.autograd.grad(loss, wrt)


@pytest.mark.parametrize("name", list(_cases()))
def test_kernel_function_under_torch_func(name):
    """grad, vmap(grad) per sample and jacrev through the Function equal eager autograd of a
    plain-torch formula."""
    case = _cases()[name]
    outs = case.ref(case.data, case.weights)
    outs = outs if isinstance(outs, tuple) else (outs,)
    probes = [_randn(*o.shape, seed=20 + i) for i, o in enumerate(outs)]
    floats = [i for i, t in enumerate(case.data) if t.is_floating_point()]

    def loss(diff, weights, data, probes):
        full = list(data)
        for i, t in zip(floats, diff, strict=True):
            full[i] = t
        return _loss(case.fn, full, list(weights), probes)

    diff = tuple(case.data[i] for i in floats)
    got = grad(loss, argnums=(0, 1))(diff, tuple(case.weights), case.data, probes)
    _close(got[0] + got[1], _eager_grads(case, case.data, probes), F64, f"{name}: grad")

    def one(diff, weights, data, probes):  # a single sample, given its own batch dim of 1
        return loss([t[None] for t in diff], weights, [t[None] for t in data],
                    [p[None] for p in probes])

    per = vmap(grad(one, argnums=(0, 1)), in_dims=(0, None, 0, 0))(
        diff, tuple(case.weights), case.data, probes)
    for s in range(B):
        want = _eager_grads(case, [t[s : s + 1] for t in case.data],
                            [p[s : s + 1] for p in probes])
        want = tuple(g[0] for g in want[: len(floats)]) + want[len(floats) :]
        _close(tuple(g[s] for g in per[0] + per[1]), want, F64, f"{name}: vmap(grad)[{s}]")

    def out_of(first):  # the outputs as a function of the first float input
        data = list(case.data)
        data[floats[0]] = first
        return case.fn(data, case.weights)

    def ref_of(first):
        data = list(case.data)
        data[floats[0]] = first
        return case.ref(data, case.weights)

    first = case.data[floats[0]]
    _close(jacrev(out_of)(first), torch.autograd.functional.jacobian(ref_of, first), F64,
           f"{name}: jacrev")


def test_float32_onednn_kernels_under_grad():
    """float32 runs the forward on oneDNN (no transform is running inside a Function's forward
    under grad) and the backward as plain products: within float32 rounding of eager."""
    x, w, b = (_randn(B, 6, 6, 16, seed=1, dtype=torch.float32), _randn(24, 16, seed=2,
               dtype=torch.float32), _randn(24, seed=3, dtype=torch.float32))
    loss = lambda x, w, b: linear(x, w, b).square().sum()  # noqa: E731
    eager = [t.clone().requires_grad_() for t in (x, w, b)]
    want = torch.autograd.grad(loss(*eager), eager)
    _close(grad(loss, argnums=(0, 1, 2))(x, w, b), want, 1e-5,
           "float32 linear: grad")  # measured 1.1e-7


# -- whole models, beside a tiny BERT ----------------------------------------------------------

T = 9  # tokens: block_rows=4 leaves a partial last block
MODELS = ["encoder-fused-full", "encoder-fused-blocked", "encoder-einsum-full",
          "encoder-einsum-blocked", "decoder-auto-full", "decoder-auto-blocked", "bert"]


def _batch(kind: str):
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(5, 100, (B, T), generator=g)
    mask = torch.ones(B, T, dtype=torch.long)
    mask[1, 5:] = 0
    mask[3, 7:] = 0
    labels = torch.tensor([0, 2, 1, 1]) if kind != "decoder" else None
    return ids, mask, labels


def _model(name: str, dtype=torch.float64):
    """The model, its kind, and its forward's keyword for the padding mask under vmap."""
    torch.manual_seed(0)
    if name == "bert":
        import transformers

        cfg = transformers.BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                      intermediate_size=64, vocab_size=100, num_labels=3)
        return transformers.BertForSequenceClassification(cfg).to(dtype).eval(), "bert"
    kind, backend, memory = name.split("-")
    model = folnet.build_model("jmc.atp", preset="tiny", kind=kind, vocab_size=100,
                               backend=backend, num_labels=3,
                               head="classification" if kind == "encoder" else None)
    if memory == "blocked":
        folnet.set_memory(model, "blocked", block_rows=4)
    # (folnet's input value checks read values, int(ids.max()), which a batched tensor does
    # not hand out: they are skipped under vmap, as while tracing, with validate left as is)
    return model.to(dtype).eval(), kind


def _row_losses(kind: str, logits: torch.Tensor, ids, mask, labels) -> torch.Tensor:
    """One loss per row (B,): cross-entropy of the label, or the mean next-token
    cross-entropy over the row's real targets."""
    if kind != "decoder":
        return F.cross_entropy(logits, labels, reduction="none")
    ce = F.cross_entropy(logits[:, :-1].transpose(1, 2), ids[:, 1:], reduction="none")
    real = mask[:, 1:].to(ce.dtype)  # (B, T-1)
    return (ce * real).sum(1) / real.sum(1)


def _vmap_mask(kind: str, mask: torch.Tensor) -> torch.Tensor:
    """The padding mask a per-sample vmap hands the model: BERT's mask code (transformers
    5.24, masking_utils) branches on ``padding_mask.all()``, which vmap refuses, so it gets
    the 4D boolean mask it passes through; folnet takes its (B, T) mask."""
    if kind == "bert":
        return mask.bool()[:, None, None, :].expand(-1, 1, T, T)
    return mask


def _per_row(model, kind, params, ids, mask, labels) -> torch.Tensor:
    logits = functional_call(model, params, (ids,), {"attention_mask": mask}).logits
    return _row_losses(kind, logits, ids, mask, labels)


def _eager(model, kind, ids, mask, labels) -> dict[str, torch.Tensor]:
    """Eager ``.backward()`` of the summed row losses (zeros for parameters it misses)."""
    model.zero_grad()
    _row_losses(kind, model(ids, attention_mask=mask).logits, ids, mask, labels).sum().backward()
    return {k: torch.zeros_like(p) if p.grad is None else p.grad.clone()
            for k, p in model.named_parameters()}


@pytest.mark.parametrize("name", MODELS)
def test_model_under_torch_func(name):
    """grad = eager backward; vmap(grad) and jacrev per sample = a loop of one-row eager
    backwards; grad = central finite differences along a random direction."""
    model, kind = _model(name)
    ids, mask, labels = _batch(kind)
    params = {k: p.detach() for k, p in model.named_parameters()}

    def total(p):
        return _per_row(model, kind, p, ids, mask, labels).sum()

    got = grad(total)(params)
    assert_rel(_flat(got), _flat(_eager(model, kind, ids, mask, labels)), F64, f"{name}: grad")

    loop = [_eager(model, kind, ids[s : s + 1], mask[s : s + 1],
                   None if labels is None else labels[s : s + 1]) for s in range(B)]

    def one(p, i, m, lab):
        lab = None if lab is None else lab[None]
        logits = functional_call(model, p, (i[None],), {"attention_mask": m[None]}).logits
        return _row_losses(kind, logits, i[None], m[None], lab)[0]

    per = vmap(grad(one), in_dims=(None, 0, 0, None if labels is None else 0))(
        params, ids, _vmap_mask(kind, mask), labels)
    jac = jacrev(lambda p: _per_row(model, kind, p, ids, mask, labels))(params)
    for s in range(B):
        want = _flat(loop[s])
        assert_rel(_flat({k: v[s] for k, v in per.items()}), want, F64, f"{name}: vmap(grad)[{s}]")
        assert_rel(_flat({k: v[s] for k, v in jac.items()}), want, F64, f"{name}: jacrev[{s}]")

    g = torch.Generator().manual_seed(9)
    direction = {k: torch.randn(p.shape, generator=g, dtype=p.dtype) for k, p in params.items()}
    h = 1e-6
    shifted = [total({k: p + sign * h * direction[k] for k, p in params.items()})
               for sign in (1, -1)]
    fd = (shifted[0] - shifted[1]) / (2 * h)
    analytic = sum((got[k] * direction[k]).sum() for k in params)
    # central differences in float64 at h = 1e-6: truncation ~h^2, rounding ~1e-16 / h
    assert_rel(fd, analytic, 1e-6, f"{name}: finite differences")  # measured ~1e-9


@pytest.mark.parametrize("name", ["encoder-fused-full", "encoder-fused-blocked", "bert"])
def test_dropout_under_torch_func(name):
    """Training mode. grad draws the masks eager mode draws (same seed: same gradient).
    vmap(randomness="same") shares one draw across the batch, as torch does: it equals a loop
    that reseeds before each row. folnet refuses randomness="error" and "different" naming
    what to do; torch refuses "error" for BERT."""
    model, kind = _model(name)
    model.train()
    ids, mask, labels = _batch(kind)
    params = {k: p.detach() for k, p in model.named_parameters()}
    torch.manual_seed(7)
    got = grad(lambda p: _per_row(model, kind, p, ids, mask, labels).sum())(params)
    torch.manual_seed(7)
    assert_rel(_flat(got), _flat(_eager(model, kind, ids, mask, labels)), F64,
               f"{name}: grad in training")

    def one(p, i, m, lab):
        logits = functional_call(model, p, (i[None],), {"attention_mask": m[None]}).logits
        return F.cross_entropy(logits, lab[None])

    torch.manual_seed(11)
    per = vmap(grad(one), in_dims=(None, 0, 0, 0), randomness="same")(
        params, ids, _vmap_mask(kind, mask), labels)
    for s in range(B):
        torch.manual_seed(11)
        want = _eager(model, kind, ids[s : s + 1], mask[s : s + 1], labels[s : s + 1])
        assert_rel(_flat({k: v[s] for k, v in per.items()}), _flat(want), F64,
                   f"{name}: vmap same [{s}]")
    errors = (FolnetError, RuntimeError) if kind == "bert" else (FolnetError,)
    for mode in ("error", "different") if kind != "bert" else ("error",):
        with pytest.raises(errors, match="randomness") as info:
            vmap(grad(one), in_dims=(None, 0, 0, 0), randomness=mode)(
                params, ids, _vmap_mask(kind, mask), labels)
        if kind != "bert":
            assert "model.eval()" in str(info.value) and "\n" not in str(info.value)
