"""The GPU path: every backend the CUDA priority list can pick (and ``fused``) against a float64
CPU reference for each built-in operator and kind, SDPA's kernels forced one at a time, models
on the device against float64 on the CPU, row blocks against the whole square, bf16 autocast
steps, cached generation against recomputation, a one-process DDP step, torch.compile and
the fused residual norm.

Every test takes the ``device`` fixture: "cuda" when there is one; without one the tests skip,
unless ``FOLNET_GPU_REHEARSAL=1`` is set, which runs them on the CPU (benchmarks/gpu_check.py
--dry-run), so that the code the rare GPU run executes is exercised here and cannot rot. What
is CUDA-only in essence (NCCL, a forced fused SDPA kernel) skips on the CPU, saying why, after
running what it can. The bounds follow tests/tolerances.py; each comparison is recorded when
``FOLNET_TOLERANCE_LOG`` names a file (benchmarks/gpu_check.py reports the shares used).
"""

from __future__ import annotations

import copy
import datetime
import os
import sys
import warnings
from pathlib import Path

import pytest
import torch
from batches import pretraining_batch
from opdata import inputs
from paths import BENCHMARKS
from tolerances import (
    assert_at_most,
    assert_bf16_rel,
    assert_close,
    assert_rel,
    assert_tokens_lead,
)

import folnet
from folnet.ops.backends import BACKENDS, PRIORITY, OpCall
from folnet.ops.compiler import compile_operator
from folnet.ops.primitives.device import emulate
from folnet.ops.primitives.dropout import portable_masks

sys.path.insert(0, str(BENCHMARKS))
from bf16_curve import compare, curve
from models import tiny_model

#: Compared at tolerances: `make tolerances` rehearses these on both CPU kernel sets.
pytestmark = pytest.mark.numerics
REHEARSAL = "FOLNET_GPU_REHEARSAL"
BUILTINS = "bcjmapt"
#: What auto can pick on CUDA, and the fused backend (it declares no device restriction).
GPU_BACKENDS = (*PRIORITY["cuda"], "fused")
KINDS = ("bidirectional", "causal", "padded")
#: 16 tokens and channels of 8: the sizes SDPA's fused kernels accept in half precision.
SIZES = {"x": 16, "y": 16, "a": 16, "h": 2, "s": 8, "w": 8}
#: One device computation against float64: float32 rounds at 6e-8, measured on the CPU at
#: ~1e-7 relative for these sums; bf16 keeps 8 bits (2e-3 per rounding; backends against each
#: other measured 3.8e-3 in tests/ops/test_ops_kernels.py), so 5e-2 leaves 13x; a wrong
#: contraction or mask is off by O(1).
OP_BOUND = {torch.float32: 1e-5, torch.bfloat16: 5e-2}


@pytest.fixture
def device():
    """"cuda"; or, rehearsing, "cpu" with every kernel choice a CUDA device makes
    (`folnet.ops.primitives.device.emulate`), so the rehearsal runs the GPU's code path."""
    if torch.cuda.is_available():
        yield "cuda"
    elif os.environ.get(REHEARSAL) == "1":
        with emulate("cuda"):
            yield "cpu"
    else:
        pytest.skip(f"needs a CUDA device ({REHEARSAL}=1 runs these tests on the CPU)")


def _operator_cases():
    for kind in KINDS:
        for symbol in BUILTINS:
            spec = folnet.get_operator(symbol)
            for backend in GPU_BACKENDS:  # only what the backend can ever run (no skips)
                if BACKENDS[backend].why_not_spec(spec, kind == "causal") is None:
                    yield symbol, backend, kind


def _against_float64(op, symbol: str, device: str, dtype: torch.dtype, padded: bool,
                     what: str, seed: int = 4) -> None:
    """``op`` on ``device`` in ``dtype`` against the float64 CPU einsum reference on the same
    (rounded) inputs: the output, then the kernel and premise gradients of one random seed."""
    spec = folnet.get_operator(symbol)
    # (2, *kernel letters), (2, *premise letters), rounded to dtype once
    k, v = (t.to(dtype) for t in inputs(spec, seed=seed, sizes=SIZES))
    mask = torch.ones(2, SIZES["x"], dtype=torch.bool) if padded else None  # (B, T)
    if padded:
        mask[1, 11:] = False  # row 1: 11 real tokens
    ref = compile_operator(symbol, "einsum", causal=op.causal)
    want_k, want_v = k.double().requires_grad_(), v.double().requires_grad_()
    want = ref(want_k, want_v, mask)  # float64 on the CPU
    got_k, got_v = k.to(device).requires_grad_(), v.to(device).requires_grad_()
    got = op(got_k, got_v, None if mask is None else mask.to(device))
    assert got.dtype == dtype and got.device.type == device
    seed_grad = torch.randn(want.shape, generator=torch.Generator().manual_seed(5),
                            dtype=torch.float64).to(dtype)
    want.backward(seed_grad.double())
    got.backward(seed_grad.to(device))
    bound = OP_BOUND[dtype]
    assert_rel(got, want, bound, f"{what} output")
    assert_rel(got_k.grad, want_k.grad, bound, f"{what} kernel gradient")
    assert_rel(got_v.grad, want_v.grad, bound, f"{what} premise gradient")
    assert want_k.grad.norm() > 0 and want_v.grad.norm() > 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize(("symbol", "backend", "kind"), list(_operator_cases()))
def test_backend_matches_the_float64_reference(device, symbol, backend, kind, dtype):
    spec = folnet.get_operator(symbol)
    causal, padded = kind == "causal", kind == "padded"
    reason = BACKENDS[backend].why_not(spec, OpCall(torch.device(device), dtype, causal, padded,
                                                  True))
    if reason is not None:
        pytest.skip(f"{backend} cannot run {symbol!r} on {device}: {reason}")
    op = compile_operator(symbol, backend, causal=causal)
    call = op.describe_call(torch.zeros(1, device=device, dtype=dtype), padded=padded,
                            requires_grad=True)
    assert op.select(call).name == backend
    _against_float64(op, symbol, device, dtype, padded, f"{backend} {symbol} {kind} {dtype}")


SDPA_KERNELS = ("EFFICIENT_ATTENTION", "FLASH_ATTENTION", "CUDNN_ATTENTION", "MATH")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("symbol", "jmct")
@pytest.mark.parametrize("kernel", SDPA_KERNELS)
def test_each_sdpa_kernel_that_runs_matches_the_float64_reference(device, kernel, symbol,
                                                                  dtype):
    """SDPA forced onto one kernel, a padded call (the pad's bias is the dtype's lowest value).
    A kernel that refuses the call (flash takes no bias; on the CPU only math takes a bias
    that needs a gradient) skips with torch's reasons; one that runs must be right."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    op = compile_operator(symbol, "sdpa")
    with warnings.catch_warnings(record=True) as caught, \
            sdpa_kernel([getattr(SDPBackend, kernel)]):
        warnings.simplefilter("always")
        try:
            _against_float64(op, symbol, device, dtype, True, f"sdpa[{kernel}] {symbol} {dtype}")
        except RuntimeError as exc:
            if "No available kernel" not in str(exc) and "No viable backend" not in str(exc):
                raise
            why = " ".join(" ".join(str(w.message).split("(Triggered")[0].split())
                           for w in caught)
            first = str(exc).strip().splitlines()[0]
            pytest.skip(f"{kernel} refuses this call on {device}: {first} {why}".strip())


def test_auto_takes_the_device_priority_list(device):
    model = _model("encoder", "jmc.atp", device)
    layer = model.encoder.layers[0]
    call = layer.ops[0].describe_call(torch.zeros(1, device=device), padded=False,
                                      requires_grad=True)
    chosen = {op.spec.symbol: op.select(call).name for op in layer.ops}
    # CUDA's list (rehearsed on the CPU too): xformers where it fits and is installed, einsum
    # for the rest -- never SDPA's unfused math path
    first = "xformers" if chosen["j"] == "xformers" else "einsum"
    want = {"j": first, "m": first, "c": first, "t": first, "a": "einsum", "p": "einsum"}
    assert chosen == want and "sdpa" not in chosen.values()


def _model(kind: str, ops: str, device: str | None = None, seed: int = 0, **kw):
    model = tiny_model(ops, kind, seed=seed, **kw)
    return model if device is None else model.to(device)


MODELS = [
    ("encoder", "jmc.atp", {"head": "pretraining"}),
    ("encoder", "jmc.atp", {"head": "pretraining", "backend": "einsum"}),
    ("encoder", "jmc.atp", {"head": "pretraining", "backend": "fused,einsum"}),
    ("encoder", "jmc.atp", {"head": "classification", "num_labels": 3, "position": "ape+rpe"}),
    ("encoder", "jmc.atp", {"head": "pretraining", "position": "rpe*"}),
    ("decoder", "jmc.atp", {}),
    ("encoder-decoder", "jm.atp", {}),
]


@pytest.mark.parametrize(("kind", "ops", "kw"), MODELS,
                         ids=[f"{k}-{o}-{'-'.join(map(str, kw.values()))}" for k, o, kw in MODELS])
def test_model_outputs_and_gradients_match_float64_on_the_cpu(device, kind, ops, kw):
    """21 tokens (no multiple of 8: fused SDPA kernels must fall back or cope), row 1 padded."""
    want_model, got_model = _model(kind, ops, **kw).double(), _model(kind, ops, device, **kw)
    ids = torch.randint(5, 100, (2, 21), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, 17:] = 0
    results = []
    for model, dev in ((want_model, "cpu"), (got_model, device)):
        if kind == "encoder-decoder":
            out = model(ids.to(dev), ids[:, :9].to(dev))
        else:
            out = model(ids.to(dev), attention_mask=mask.to(dev))
        logits = out.logits if out.logits is not None else out.mlm_logits
        logits.double().square().mean().backward()
        results.append((logits, {n: p.grad for n, p in model.named_parameters()
                                 if p.grad is not None}))
    (want, want_grads), (got, got_grads) = results
    # float32 against float64: logits measured ~1e-7 relative on the CPU; a gradient that is a
    # near-cancelling sum keeps its terms' rounding (up to ~1e-5 measured for nsp.weight)
    assert_rel(got, want, 1e-4, f"{kind} {ops} logits")
    assert got_grads.keys() == want_grads.keys() and len(want_grads) > 10
    for name, grad in want_grads.items():
        if grad.norm() > 0:
            assert_rel(got_grads[name], grad, 1e-3, f"{kind} {ops} gradient of {name}")


def _blocked_batch(kind: str, device: str) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    x = torch.randint(1, 60, (2, 11), generator=g)
    mask = torch.ones_like(x)
    mask[1, 7:] = 0
    batch = {"input_ids": x, "attention_mask": mask}
    if kind == "encoder":
        batch.update(mlm_labels=x.masked_fill(mask == 0, -100), nsp_labels=torch.tensor([0, 1]))
    elif kind == "decoder":
        batch.update(prefix_lengths=torch.tensor([4, 0]), labels=x.masked_fill(mask == 0, -100))
    else:
        batch.update(labels=torch.randint(1, 60, (2, 6), generator=g))
    return {k: v.to(device) for k, v in batch.items()}


def _loss_and_grads(model, batch, bf16: bool = False):
    torch.manual_seed(0)  # the same dropout draws in both modes
    model.zero_grad()
    device = batch["input_ids"].device.type
    with torch.autocast(device, dtype=torch.bfloat16, enabled=bf16):
        loss = model(**batch).loss
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()
                           if p.grad is not None}


@pytest.mark.parametrize(("kind", "dropout", "bf16"), [
    ("encoder", 0.0, False), ("decoder", 0.0, False), ("encoder-decoder", 0.0, False),
    ("encoder", 0.1, False), ("encoder", 0.0, True)])
def test_blocked_rows_equal_the_whole_square(device, kind, dropout, bf16):
    """As tests/arch/test_blocked_models.py: the blocked path recomputes each block in the
    backward under the RNG and autocast state of its forward; with residual and FFN dropout
    (one seed) both modes must draw the same masks -- the keep masks on every device
    (`portable_masks`: on CUDA the whole square otherwise takes torch's own dropout)."""
    head = "pretraining" if kind == "encoder" else None
    model = folnet.build_model("jmc.atp", preset="tiny", kind=kind, head=head, vocab_size=60,
                               dropout=dropout, attention_dropout=0.0).to(device).train()
    batch = _blocked_batch(kind, device)
    with portable_masks():
        folnet.set_memory(model, "full")
        loss_full, grads_full = _loss_and_grads(model, batch, bf16)
        if bf16:  # what bf16 itself moves each result: the whole square in float32
            loss_ref, grads_ref = _loss_and_grads(model, batch)
        folnet.set_memory(model, "blocked", block_rows=3)
        loss_blocked, grads_blocked = _loss_and_grads(model, batch, bf16)
    assert grads_full.keys() == grads_blocked.keys() and len(grads_full) > 10
    what = f"{kind} dropout {dropout} {'bf16' if bf16 else 'fp32'}"
    if bf16:  # each block rounds its own intermediates: bounded per tensor by bf16's own
        # distance from float32 (tests/tolerances.py: BF16_UNITS)
        assert_bf16_rel(loss_blocked, loss_full, loss_ref, f"{what} loss")
        for name, grad in grads_full.items():
            assert_bf16_rel(grads_blocked[name], grad, grads_ref[name],
                            f"{what} gradient of {name}")
    else:  # float32: the same sums in another order (1e-4: 13x over the 7.6e-6 measured)
        assert_rel(loss_blocked, loss_full, 1e-4, f"{what} loss")
        for name, grad in grads_full.items():
            assert_rel(grads_blocked[name], grad, 1e-4, f"{what} gradient of {name}")
    assert all(grads_full[n].norm() > 0 for n in grads_full if "ffn_b" in n)


@pytest.mark.parametrize("mode", ["full", "blocked"])
def test_checkpointed_training_equals_the_stored_masks(device, mode):
    """As tests/arch/test_blocked_models.py: under activation checkpointing the binary atoms
    are made again inside the first layer's checkpoint, their dropout mask drawn again from
    the device generator's saved state (`folnet.ops.primitives.rng.replay`), and every layer
    redraws its masks: the loss and gradients equal the run that stores every mask."""
    model = folnet.build_model("jmc.atp", preset="tiny", head="pretraining", vocab_size=60,
                               dropout=0.2, attention_dropout=0.1).to(device).train()
    folnet.set_memory(model, mode, block_rows=3 if mode == "blocked" else None)
    batch = _blocked_batch("encoder", device)
    loss_stored, grads_stored = _loss_and_grads(model, batch)
    model.set_activation_checkpointing(True)
    loss_redrawn, grads_redrawn = _loss_and_grads(model, batch)
    assert grads_stored.keys() == grads_redrawn.keys() and len(grads_stored) > 10
    # the same ops recomputed: float32 rounding of gradient sums in another order at most
    assert_rel(loss_redrawn, loss_stored, 1e-4, f"{mode} loss")
    for name, grad in grads_stored.items():
        assert_rel(grads_redrawn[name], grad, 1e-4, f"{mode} gradient of {name}")
    assert grads_stored["encoder.atoms.relative.weight"].norm() > 0


def test_blocked_kernel_dropout_gradient_is_the_forwards(device):
    """Kernel dropout draws one mask per block; the backward must redraw each block's masks:
    the gradient along a random direction equals float64 central differences."""
    model = folnet.build_model("jmc.atp", preset="tiny", head="pretraining", vocab_size=60,
                               dropout=0.0, attention_dropout=0.3).double().to(device).train()
    folnet.set_memory(model, "blocked", block_rows=4)
    batch = _blocked_batch("encoder", device)
    probe = torch.randn(2, 11, 60, generator=torch.Generator().manual_seed(2),
                        dtype=torch.float64).to(device)

    def functional() -> torch.Tensor:
        torch.manual_seed(5)  # the same kernel-dropout masks in every evaluation
        logits = model(batch["input_ids"], attention_mask=batch["attention_mask"]).mlm_logits
        return (logits[..., :60] * probe).sum()

    param = model.encoder.layers[0].proj_b.weight
    functional().backward()
    direction = torch.randn(param.shape, generator=torch.Generator().manual_seed(3),
                            dtype=torch.float64).to(device)
    analytic = (param.grad * direction).sum()
    eps, values = 1e-6, []
    with torch.no_grad():
        for sign in (1, -1):
            param.add_(sign * eps * direction)
            values.append(functional())
            param.sub_(sign * eps * direction)
    numeric = (values[0] - values[1]) / (2 * eps)
    assert abs(float(numeric)) > 1e-3
    # float64 central differences: truncation ~eps**2, rounding ~1e-16 / eps = 1e-10
    assert_rel(analytic, numeric, 1e-6, "gradient against central differences")


def test_bf16_autocast_training_steps_follow_float32(device):
    """The loss curves of tests/train/test_bf16_curve.py (benchmarks/bf16_curve.py) on the
    device: the same initial weights and batches, no dropout (CUDA's dropout kernel may map
    random numbers to elements differently for bf16 and float32 tensors, which is no bf16
    rounding); bf16 within 2% per step."""
    import argparse

    steps = 25 if device == "cuda" else 5  # the rehearsal runs the code, not the whole curve
    args = argparse.Namespace(preset="tiny", vocab_size=600, seq_len=32, batch=8, steps=steps,
                              lr=2e-3, device=device, model={"dropout": 0.0})
    fp32, bf16 = curve("jmc.atp", args, bf16=False), curve("jmc.atp", args, bf16=True)
    assert all(torch.isfinite(torch.tensor(fp32 + bf16)))
    r = compare(fp32, bf16)
    assert_at_most(r["max_rel_diff"], 0.02, "jmc.atp bf16 loss curve on the device")
    assert bf16 != fp32  # bf16 did run: rounding shows in the losses
    if steps >= 25:
        assert fp32[-1] < fp32[0] - 0.5  # the model learns, so the comparison means something


@pytest.mark.parametrize(("kind", "padded"), [("decoder", False), ("decoder", True),
                                              ("encoder-decoder", False)])
def test_cached_generation_equals_recomputation(device, kind, padded):
    model = _model(kind, "jmc.atp", device, seed=1, vocab_size=60).eval()  # as test_generation
    x = torch.randint(0, 60, (2, 6), generator=torch.Generator().manual_seed(0)).to(device)
    kw = {}
    if padded:  # a prefix LM with a left-padded row: visibility and padding on the rows path
        mask = torch.ones_like(x)
        mask[1, :2] = 0
        kw = {"attention_mask": mask, "prefix_lengths": torch.tensor([4, 2], device=device)}
    cached, full = (model.generate(x, 10, use_cache=c, return_logits=True, **kw)
                    for c in (True, False))
    start = x.shape[1] if kind == "decoder" else 1
    assert_tokens_lead(cached.logits.cpu(), full.sequences[:, start:].cpu(), f"greedy {kind}")
    assert torch.equal(cached.sequences, full.sequences)
    assert_close(cached.logits, full.logits, rtol=0, atol=1e-5, what=f"{kind} cached logits")


def _ddp_step(model, device: str, backend: str, store: Path) -> dict[str, torch.Tensor]:
    """One AdamW step of ``model`` wrapped in DDP over a one-process group; its parameters.
    The group meets in a file (``store``), not on a port: a port found free can be taken by
    another test's group before this one binds it, and this group would then wait on theirs."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    dist.init_process_group(backend, init_method=f"file://{store}", rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=60))
    try:
        ids = [0] if device == "cuda" else None
        wrapped = DistributedDataParallel(model, device_ids=ids, find_unused_parameters=True)
        _train_step(wrapped, device)
    finally:
        dist.destroy_process_group()
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def _train_step(model, device: str) -> None:
    batch = pretraining_batch(vocab=100, B=4, T=16, nsp=[0, 1, 1, 0])
    ids, types, labels, nsp = (t.to(device) for t in batch)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(ids, types, mlm_labels=labels, nsp_labels=nsp).loss.backward()
    opt.step()


def test_one_process_ddp_step_equals_the_plain_step(device, record_property, tmp_path):
    """NCCL on CUDA (gloo if NCCL cannot start, said in the report); gloo on the CPU. One
    process all-reduces its own gradient: the step must be the plain model's."""
    plain = _model("encoder", "jmc.atp", device, head="pretraining")
    wrapped = copy.deepcopy(plain)
    _train_step(plain, device)
    want = {n: p.detach() for n, p in plain.named_parameters()}
    backend = "nccl" if device == "cuda" else "gloo"
    try:
        got = _ddp_step(wrapped, device, backend, tmp_path / "store")
    except (RuntimeError, ValueError) as exc:
        if backend != "nccl":
            raise
        record_property("nccl_failed", str(exc).splitlines()[0][:300])
        backend, wrapped = "gloo", copy.deepcopy(_model("encoder", "jmc.atp", device,
                                                        head="pretraining"))
        got = _ddp_step(wrapped, device, backend, tmp_path / "store-gloo")
    record_property("ddp_backend", backend)
    changed = sum(not torch.equal(got[n], p) for n, p in _model(
        "encoder", "jmc.atp", device, head="pretraining").named_parameters())
    assert changed > 10  # the step moved the weights
    worst = max(float((got[n] - want[n]).abs().max()) for n in want)
    # the same arithmetic; the gradient passes through DDP's buckets, whose average over one
    # rank divides by 1: exact, with a bound for a reduction that rounds anyway
    assert_at_most(worst, 1e-6, f"ddp ({backend}) weights against the plain step")


def test_compiled_encoder_gives_the_eager_loss_and_gradients(device, record_property):
    """torch.compile of a one-layer encoder, training graph: inductor on CUDA; on the CPU the
    rehearsal traces with aot_eager (inductor's cold C++ build takes minutes on 2 cores;
    tests/arch/test_compile.py covers inductor there)."""
    backend = "inductor" if device == "cuda" else "aot_eager"
    record_property("compile_backend", backend)
    torch._dynamo.reset()
    try:
        model = _model("encoder", "jmc.atp", device, head="pretraining", L=1).eval()
        batch = [t.to(device) for t in pretraining_batch(vocab=100, T=16, masked=[2, 7])]

        def loss_and_grads():
            model.zero_grad(set_to_none=True)
            ids, types, labels, nsp = batch
            loss = model(ids, types, mlm_labels=labels, nsp_labels=nsp).loss
            loss.backward()
            return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()
                                   if p.grad is not None}

        loss, grads = loss_and_grads()
        model.encoder.compile(backend=backend)
        c_loss, c_grads = loss_and_grads()
    finally:
        torch._dynamo.reset()
    assert loss.item() > 1.0 and len(grads) > 10
    assert_close(c_loss, loss, rtol=1e-5, atol=1e-5, what=f"{backend} loss")
    for name in c_grads.keys() - grads.keys():  # unused in eager (None), zeros when compiled
        assert not c_grads[name].any(), name
    for name, grad in grads.items():
        assert_close(c_grads[name], grad, rtol=1e-4, atol=1e-5,
                     what=f"{backend} gradient of {name}")


def test_a_pretraining_step_makes_no_host_sync(device):
    """`folnet pretrain`'s step (benchmarks/steps.py builds it as the loop runs it) makes no
    host sync: on CUDA under torch's sync debug mode set to raise; rehearsed, the step census
    finds none on the CUDA path."""
    from step_census import census
    from steps import folnet_step

    step = folnet_step("tiny", path="cuda", device=device, optimizer="lamb", dropout=0.1)
    step.run()  # the first step makes what is kept (the optimiser's buckets, id squares)
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            step.run()
            step.run()
        finally:
            torch.cuda.set_sync_debug_mode(0)
    else:
        assert census(step).syncs == []


@pytest.mark.parametrize("p", [0.0, 0.2])
def test_the_fused_residual_norm_matches_the_eager_arithmetic(device, p):
    """`folnet.ops.primitives.residual_norm` where a CUDA step takes it (its Triton kernels on a
    GPU; the CPU form when rehearsing) against the eager arithmetic in float64 on the CPU,
    with the keep mask the op drew recovered from a second call under the same seed."""
    from folnet.ops.primitives import residual_norm as rn

    shape = (2, 24, 24, 48)
    g = torch.Generator().manual_seed(0)
    host = [torch.randn(shape, generator=g) for _ in range(4)]
    u, x = (t.to(device).requires_grad_() for t in host[:2])
    assert rn.why_not(u, x) is None
    keep = None
    if p:
        torch.manual_seed(1)
        keep = (rn.residual_norm(torch.zeros_like(u), torch.ones_like(x), p, 1e-12)[0] != 0)
        assert abs(keep.float().mean().item() - (1 - p)) < 0.02
        keep = keep.cpu()
    torch.manual_seed(1)
    y, n = rn.residual_norm(u, x, p, 1e-12)
    (y * host[2].to(device) + n * host[3].to(device)).sum().backward()
    u64, x64 = (t.detach().double().requires_grad_() for t in host[:2])
    ry, rnorm = rn.reference(u64, x64, keep, p, 1e-12)
    (ry * host[2].double() + rnorm * host[3].double()).sum().backward()
    for got, want, what in ((y, ry, "y"), (n, rnorm, "n"), (u.grad, u64.grad, "grad u"),
                            (x.grad, x64.grad, "grad x")):
        assert_close(got, want, rtol=1e-5, atol=1e-5, what=f"residual norm {what}")
