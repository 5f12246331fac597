"""Memory modes (`folnet.set_memory`): a model whose binary FFN runs in blocks of query rows
computes the same loss and the same gradients as the full square, for every kind of model,
with padding, for jmc.atp and a registered operator; ``"auto"`` blocks long squares only."""

from __future__ import annotations

import pytest
import torch
from tolerances import assert_at_most, assert_bf16_rel, assert_rel, rel_error

import folnet
from folnet.arch.layer.memory_modes import (
    AUTO_MIN_T,
    BLOCK_PAIRS,
    TIGHT_PAIRS,
    block_reach,
    block_rows_for,
    releases_heap,
)
from folnet.errors import FolnetError
from folnet.ops import get_operator

pytestmark = pytest.mark.numerics

V, T = 60, 11


def _batch(kind: str):
    g = torch.Generator().manual_seed(1)
    x = torch.randint(1, V, (2, T), generator=g)
    mask = torch.ones_like(x)
    mask[1, T - 4:] = 0  # the second row is padded
    if kind == "encoder":
        return {"input_ids": x, "attention_mask": mask, "mlm_labels": x.masked_fill(mask == 0,
                                                                                   -100),
                "nsp_labels": torch.tensor([0, 1])}
    if kind == "decoder":
        return {"input_ids": x, "attention_mask": mask, "prefix_lengths": torch.tensor([4, 0]),
                "labels": x.masked_fill(mask == 0, -100)}
    y = torch.randint(1, V, (2, 6), generator=g)
    return {"input_ids": x, "attention_mask": mask, "labels": y}


def _loss_and_grads(model, batch, seed: int = 0):
    torch.manual_seed(seed)  # the same dropout masks in both modes
    model.zero_grad()
    loss = model(**batch).loss
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()
                           if p.grad is not None}


#: Blocked against full, per tensor: the same sums in another order. float32: a gradient that
#: is a small difference of large terms (nsp.weight: two rows' contributions nearly cancel)
#: keeps the terms' rounding, measured up to 7.6e-6 relative on two kernel sets; 1e-4 leaves
#: 13x and is still far below what a wrong block (a mask, a slab, a dropout draw) does, 1e-2
#: and more. float64 leaves the blocking itself to check, at 1e-10.
BOUND = {torch.float32: 1e-4, torch.float64: 1e-10}


def _compare(ops: str, kind: str, dropout: float = 0.0, dtype: torch.dtype = torch.float32,
             mode: str = "blocked", **kw):
    torch.manual_seed(0)
    head = "pretraining" if kind == "encoder" else None
    model = folnet.build_model(ops, preset="tiny", kind=kind, head=head, vocab_size=V,
                               dropout=dropout, **kw).to(dtype).train()
    batch = _batch(kind)
    folnet.set_memory(model, "full")
    loss_full, grads_full = _loss_and_grads(model, batch)
    folnet.set_memory(model, mode, block_rows=3)
    loss_blocked, grads_blocked = _loss_and_grads(model, batch)
    assert grads_full.keys() == grads_blocked.keys() and len(grads_full) > 10
    bound = BOUND[dtype]
    assert_rel(loss_blocked, loss_full, bound, f"{ops} {kind} {dtype} loss")
    for name, g in grads_full.items():
        assert_rel(grads_blocked[name], g, bound, f"{ops} {kind} {dtype} gradient of {name}")
    ffn = [n for n in grads_full if "ffn_b" in n]
    assert ffn and all(grads_full[n].norm() > 0 for n in ffn)  # the stage really trained


@pytest.mark.parametrize("kind", ["encoder", "decoder", "encoder-decoder"])
def test_blocked_equals_full_jmc_atp(kind):
    _compare("jmc.atp", kind)


@pytest.mark.parametrize("kind", ["encoder", "decoder"])
def test_tight_equals_full_and_releases_the_heap_around_each_mixer_backward(kind, monkeypatch):
    """``"tight"`` computes what ``"blocked"`` does (the blocks' rows are the only other
    choice it makes), and on a CPU hands the heap back twice per layer's recomputed mixer
    stage: once before its forward blocks, twice in its backward pass."""
    import folnet.arch.layer.row_blocks as blocked

    calls = []
    monkeypatch.setattr(blocked, "release_free_memory", lambda: calls.append(1))
    _compare("jmc.atp", kind, dropout=0.1, attention_dropout=0.0, mode="tight")
    model = folnet.build_model("jmc.atp", preset="tiny", kind=kind, vocab_size=V)
    layers = [m for m in model.modules() if hasattr(m, "memory_mode")]
    assert len(layers) == model.cfg.L >= 2 and len(calls) == 3 * len(layers)


@pytest.mark.parametrize("kind", ["encoder", "decoder", "encoder-decoder"])
def test_blocked_equals_full_in_float64(kind):
    _compare("jmc.atp", kind, dtype=torch.float64)


@pytest.mark.parametrize("kind", ["encoder", "decoder"])
def test_blocked_equals_full_registered_operator(kind, trans_first):
    _compare(f"jmc.atp{trans_first}", kind)  # trans_first: conftest.py


@pytest.mark.parametrize("kind", ["encoder", "decoder"])
def test_blocked_equals_full_with_dropout_under_one_seed(kind):
    """Residual and FFN dropout draw the same masks in both modes. (The operators' kernel
    dropout draws one mask per block, which cannot equal the full square's one draw: see
    `test_blocked_kernel_dropout_gradient_is_the_forwards`.)"""
    _compare("jmc.atp", kind, dropout=0.1, attention_dropout=0.0)


def test_blocked_kernel_dropout_gradient_is_the_forwards():
    """With kernel dropout each block's recomputation in the backward pass must redraw the
    masks its forward drew: the gradient then matches central differences of a float64
    functional of the outputs taken under the same seed."""
    torch.manual_seed(0)
    model = folnet.build_model("jmc.atp", preset="tiny", head="pretraining", vocab_size=V,
                               dropout=0.0, attention_dropout=0.3).double().train()
    model.relations = True  # the functional reads the final binary stream
    folnet.set_memory(model, "blocked", block_rows=4)
    batch = _batch("encoder")
    inputs = {k: batch[k] for k in ("input_ids", "attention_mask")}
    g = torch.Generator().manual_seed(2)
    probe = {}

    def functional():
        torch.manual_seed(5)  # the same kernel-dropout masks in every evaluation
        out = model(**inputs)
        total = 0.0
        for name in ("mlm_logits", "relation_output"):
            t = getattr(out, name)
            probe.setdefault(name, torch.randn(t.shape, generator=g, dtype=t.dtype))
            total = total + (t * probe[name]).sum()
        return total

    param = model.encoder.layers[0].proj_b.weight
    functional().backward()
    direction = torch.randn(param.shape, generator=g, dtype=param.dtype)
    analytic = (param.grad * direction).sum()
    eps, values = 1e-6, []
    with torch.no_grad():
        for sign in (1, -1):
            param.add_(sign * eps * direction)
            values.append(functional())
            param.sub_(sign * eps * direction)
    numeric = (values[0] - values[1]) / (2 * eps)
    assert abs(numeric) > 1e-2
    # float64 central differences: truncation ~eps**2, rounding ~1e-16 / eps = 1e-10
    assert_rel(analytic, numeric, 1e-6, "gradient against central differences")


def test_blocked_really_blocks(monkeypatch):
    """The blocked mode calls the blocked kernel with the rows asked for."""
    import folnet.arch.layer.ffn as ffn_module

    seen = []
    real = ffn_module.binary_ffn

    def spy(*args, rows=None, **kwargs):
        if rows is not None:
            seen.append((args[0].shape[1], rows))
        return real(*args, rows=rows, **kwargs)

    monkeypatch.setattr(ffn_module, "binary_ffn", spy)
    model = folnet.build_model("jmc.atp", preset="tiny", vocab_size=V, dropout=0.0)
    model.relations = True  # every layer's binary FFN runs
    x = torch.randint(1, V, (1, T))
    model(x)
    assert seen == []  # "auto" at T < AUTO_MIN_T: the full square
    folnet.set_memory(model, "blocked", block_rows=4)
    model(x)
    assert seen == [(T, 4)] * model.cfg.L


def test_auto_choice_and_errors():
    assert block_rows_for(128, "auto", None) is None
    assert block_rows_for(AUTO_MIN_T, "auto", None, row_pairs=1) == BLOCK_PAIRS["mixer"]
    assert block_rows_for(512, "auto", None, row_pairs=2 * 512) == BLOCK_PAIRS["mixer"] // 1024
    ffn_rows = block_rows_for(512, "auto", None, row_pairs=2 * 512, stage="ffn")
    assert ffn_rows == BLOCK_PAIRS["ffn"] // 1024
    assert block_rows_for(512, "blocked", None, row_pairs=1 << 30) == 1  # at least one row
    assert block_rows_for(512, "auto", 32) == 32
    assert block_rows_for(4096, "full", None) is None
    assert block_rows_for(8, "blocked", None, row_pairs=8) == BLOCK_PAIRS["mixer"] // 8
    # off the CPU "auto" keeps the full square at every length; "blocked" still blocks there
    for device_type in ("cuda", "meta", "mps"):
        assert block_rows_for(4096, "auto", None, device_type=device_type) is None
        assert block_rows_for(4096, "blocked", 8, device_type=device_type) == 8
    assert block_rows_for(4096, "auto", 8, device_type="cpu") == 8
    # "tight": smaller blocks by default (16 mixer and 8 FFN rows at batch 2, T 512), the rows
    # asked for when given, blocked on every device, the heap released on a CPU only
    for stage, rows in (("mixer", 16), ("ffn", 8)):
        assert block_rows_for(512, "tight", None, row_pairs=2 * 512, stage=stage) == rows
        assert TIGHT_PAIRS[stage] < BLOCK_PAIRS[stage]
    assert block_rows_for(8, "tight", 3, device_type="cuda") == 3
    assert releases_heap("tight", "cpu") and not releases_heap("tight", "cuda")
    assert not any(releases_heap(mode, "cpu") for mode in ("auto", "full", "blocked"))
    model = folnet.build_model("j.a", preset="tiny")
    with pytest.raises(FolnetError, match=r"memory mode 'tiled' is unknown; use 'auto', 'full'"):
        folnet.set_memory(model, "tiled")
    with pytest.raises(FolnetError, match=r"block_rows must be a positive integer .* got 0"):
        folnet.set_memory(model, "blocked", block_rows=0)
    with pytest.raises(FolnetError, match="has no FOLNet layer"):
        folnet.set_memory(torch.nn.Linear(2, 2), "blocked")


def test_info_reports_both_paths():
    from folnet.arch import model_info

    with torch.device("meta"):
        model = folnet.build_model("jmc.atp", preset="tiny")
    info = model_info(model, 64)
    cfg = model.cfg
    hidden = cfg.L * 64 * 64 * cfg.F2 * 4  # one float32 hidden layer of the binary FFN
    assert info.activation_bytes - info.activation_bytes_blocked >= hidden
    assert "with the mixer and the binary FFN in row blocks" in info.render()
    assert [layer.memory_mode for layer in model.encoder.layers] == ["auto"] * cfg.L


def test_blocked_under_bf16_autocast_trains_like_the_full_square():
    torch.manual_seed(0)
    model = folnet.build_model("jmc.atp", preset="tiny", head="pretraining", vocab_size=V,
                               dropout=0.0).train()
    batch = _batch("encoder")
    folnet.set_memory(model, "full")
    loss_ref, grads_ref = _loss_and_grads(model, batch)  # float32: what bf16 itself moves
    results = []
    for mode in ("full", "blocked"):
        folnet.set_memory(model, mode, block_rows=4)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            results.append(_loss_and_grads(model, batch))
    (loss_full, grads_full), (loss_blocked, grads_blocked) = results
    # bounded per tensor by bf16's own distance from float32 (tests/tolerances.py)
    assert_bf16_rel(loss_blocked, loss_full, loss_ref, "bf16 loss")
    for name, g in grads_full.items():
        assert grads_blocked[name].dtype == torch.float32  # parameters keep their dtype
        assert_bf16_rel(grads_blocked[name], g, grads_ref[name], f"bf16 gradient of {name}")


def test_blocked_bf16_gradients_are_summed_over_the_blocks_in_float32():
    """A tensor every block reads whole (j's and a's unary premises, t's binary one) gets one
    gradient per block; under bf16 autocast those are summed in float32, so that many blocks
    are as accurate as the whole square's one product. Summed in bf16 (before), 48 blocks of
    one row put layer 0's proj_u gradient 0.0074 from float64 against the whole square's
    0.0046 (1.6x, Intel Xeon)."""
    torch.manual_seed(0)
    model = folnet.build_model("jmc.atp", preset="tiny", head="pretraining", vocab_size=V,
                               dropout=0.0).double().train()
    x = torch.randint(1, V, (2, 48), generator=torch.Generator().manual_seed(1))
    batch = {"input_ids": x, "mlm_labels": x, "nsp_labels": torch.tensor([0, 0])}
    folnet.set_memory(model, "full")
    _, ref = _loss_and_grads(model, batch)  # float64
    model.float()
    errors = {}
    for mode in ("full", "blocked"):
        folnet.set_memory(model, mode, block_rows=1)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            _, grads = _loss_and_grads(model, batch)
        errors[mode] = {n: rel_error(grads[n], ref[n]) for n in ref if "proj_" in n}
    assert len(errors["full"]) >= 4
    for name, err in errors["blocked"].items():  # bf16's own error, not 48 roundings of it
        excess = max(0.0, err / errors["full"][name] - 1.0)  # measured <= 0.02; 0.6 before
        assert_at_most(excess, 0.25, f"48 blocks' {name} error beyond the whole square's")


def test_blocked_equals_full_under_rpe_star():
    _compare("jmc.atp", "encoder", position="rpe*")  # static terms read the blocks' rel ids


def test_blocked_equals_full_with_a_folded_shared_premise(monkeypatch):
    """A tensor every row reads whole (``t``'s premise) may be folded by the fused backend for
    some model dimensions: the blocks then read it from the whole normalised stream."""
    from folnet.ops.backends.fused import FusedBackend

    real = FusedBackend.layout

    def layout(self, op, role):
        return "fold" if (op.spec.symbol, role) == ("t", "premise") else real(self, op, role)

    monkeypatch.setattr(FusedBackend, "layout", layout)
    _compare("jmc.atp", "encoder")


def _widest_saved(model, batch, mode: str) -> float:
    """The widest pair-indexed tensor the forward pass saves for the backward, in channels per
    token pair of the binary stream (B x T x T; pair axes as (T, T) or flattened)."""
    folnet.set_memory(model, mode, block_rows=4)
    pairs = batch["input_ids"].numel() * T
    widest = 0.0

    def pack(t):
        nonlocal widest
        if list(t.shape).count(T) >= 2 or any(n in (T * T, pairs) for n in t.shape):
            widest = max(widest, t.numel() / pairs)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(**batch).loss.backward()
    return widest


@pytest.mark.parametrize("kind", ["encoder", "decoder"])
def test_blocked_saves_no_tensor_wider_than_the_stream(kind):
    """Full square: the operators' kernels and premises and the FFN's hidden layer are saved
    (F2 = 4 D2 channels per pair); blocked: nothing wider than the binary stream itself."""
    torch.manual_seed(0)
    head = "pretraining" if kind == "encoder" else None
    model = folnet.build_model("jmc.atp", preset="tiny", kind=kind, head=head, vocab_size=V,
                               dropout=0.0).train()
    batch = _batch(kind)
    d2 = model.cfg.D2
    assert _widest_saved(model, batch, "full") >= model.cfg.F2
    assert _widest_saved(model, batch, "blocked") <= d2


def test_block_reach_reads_the_query_letter_from_the_specs():
    """What a block of rows reads of each kernel and premise, from the typing specs alone
    (bidirectional forms): the query letter first -> its rows, last -> its columns."""
    specs = {i: get_operator(s) for i, s in enumerate("jmcatp")}
    reach = {(specs[i].symbol, role): where for where, keys in block_reach(specs).items()
             for i, role in keys}
    assert reach == {
        ("j", "kernel"): "row", ("j", "premise"): "all",  # x a h / a h s
        ("m", "kernel"): "row", ("m", "premise"): "row",
        ("c", "kernel"): "all", ("c", "premise"): "col",  # a s h / a x s
        ("a", "kernel"): "row", ("a", "premise"): "all",  # x h w / y h w
        ("t", "kernel"): "row", ("t", "premise"): "all",  # x a h / a y h
        ("p", "kernel"): "row", ("p", "premise"): "row"}


@pytest.mark.parametrize("kind", ["encoder", "decoder"])
def test_blocked_equals_full_on_the_attention_backend(kind, monkeypatch):
    """CUDA's first choices (xformers, then SDPA) are attention backends: SDPA, forced here,
    runs inside the blocks (a block's query rows against every key) as over the full square."""
    calls = []
    real = torch.nn.functional.scaled_dot_product_attention

    def spy(q, k, v, *args, **kw):
        calls.append((q.shape[-2], k.shape[-2]))
        return real(q, k, v, *args, **kw)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    _compare("jmc.atp", kind, backend="sdpa,einsum")
    assert any(q == 3 and k == T for q, k in calls), calls  # blocks of 3 rows ran on SDPA


def test_ts_premise_gradient_goes_to_its_sink_on_the_fused_backend(monkeypatch):
    """In the backward pass each block hands t's shared premise to the fused backend with a
    sink, so its gradient is accumulated in place (not one full-size tensor per block); the
    unary premises every row reads (j's, a's) get theirs too."""
    import folnet.ops.backends.fused as fused

    seen = []
    real = fused.sink_einsum

    def spy(equation, left, right, sinks=(None, None)):
        if sinks[1] is not None and tuple(right.shape[1:3]) == (T, T):  # (B, a, y, h): t's
            seen.append(sinks[0] is None)
        return real(equation, left, right, sinks=sinks)

    monkeypatch.setattr(fused, "sink_einsum", spy)
    model = folnet.build_model("jmc.atp", preset="tiny", head="pretraining", vocab_size=V,
                               dropout=0.0).train()
    model.relations = True  # every layer runs t
    folnet.set_memory(model, "blocked", block_rows=3)
    batch = _batch("encoder")
    model(**batch).loss.backward()
    blocks = -(-T // 3) * len(model.encoder.layers)
    assert seen == [True] * blocks  # t's premise: one sink per block and layer, its only one


@pytest.mark.parametrize("kind", ["encoder", "decoder"])
def test_a_checkpointed_forward_keeps_no_residual_mask(kind, monkeypatch):
    """Under activation checkpointing the forward keeps the layers' inputs and nothing else: the
    blocks' recomputed function is held by the graph until the backward pass, so a mask it held
    (through the block function's closure) would outlive the checkpoint's free -- a quarter of
    the binary stream per layer, measured at the step's peak before this was fixed. Every mask
    the mixer draws in the forward must be gone once the loss exists; the backward pass then
    draws its own (the same, by the checkpoint's RNG state)."""
    import gc
    import weakref

    from folnet.arch.layer import mixer

    drawn: list = []

    def recording(shape, p, device):
        mask = keep_mask(shape, p, device)
        drawn.append(weakref.ref(mask))
        return mask

    keep_mask = mixer.keep_mask
    monkeypatch.setattr(mixer, "keep_mask", recording)
    torch.manual_seed(0)
    head = "pretraining" if kind == "encoder" else None
    model = folnet.build_model("jmc.atp", preset="tiny", kind=kind, head=head, vocab_size=V,
                               dropout=0.1).train()
    model.set_activation_checkpointing(True)
    folnet.set_memory(model, "blocked", block_rows=3)
    loss = model(**_batch(kind)).loss
    gc.collect()
    assert len(drawn) >= 2 * len(model.plan.layers) - 1  # u1 and u2 residuals per layer
    alive = [r for r in drawn if r() is not None]
    assert not alive, f"{len(alive)} of {len(drawn)} residual masks outlived the forward"
    loss.backward()  # the recomputation draws them again and the step completes
    assert len(drawn) > 2 * len(model.plan.layers)


@pytest.mark.parametrize(("kind", "mode"), [("encoder", "full"), ("encoder", "blocked"),
                                           ("decoder", "blocked"), ("encoder-decoder", "full")])
def test_checkpointing_changes_no_dropout_draw(kind, mode):
    """Activation checkpointing makes the binary atoms inside the first layer's checkpoint
    (their dropout drawn again there, from its generator state); layers redraw their masks in
    their recomputation. The loss and every gradient equal the run that stores every mask."""
    torch.manual_seed(0)
    model = folnet.build_model("jmc.atp", preset="tiny", kind=kind, vocab_size=V,
                               head="pretraining" if kind == "encoder" else None,
                               dropout=0.2, attention_dropout=0.1).train()
    folnet.set_memory(model, mode, block_rows=3 if mode == "blocked" else None)
    batch = _batch(kind)
    stored = _loss_and_grads(model, batch, seed=7)
    model.set_activation_checkpointing(True)
    redrawn = _loss_and_grads(model, batch, seed=7)
    assert_rel(redrawn[0], stored[0], BOUND[torch.float32], f"{mode} loss")
    assert stored[1].keys() == redrawn[1].keys()
    for name, g in stored[1].items():
        assert_rel(redrawn[1][name], g, BOUND[torch.float32], f"{mode} gradient of {name}")
    rel = [n for n in stored[1] if n.endswith("atoms.relative.weight")]
    assert rel and all(stored[1][n].norm() > 0 for n in rel)  # the tables were trained


def test_a_checkpointed_stack_keeps_no_binary_atoms(monkeypatch):
    """Checkpointed, the binary atoms (a square) are made inside the first layer's checkpoint
    and dropped after its forward: none is alive once the loss exists. Without checkpointing
    they are kept (the graph needs them): the check can fail."""
    import gc
    import weakref

    from folnet.arch.layer.atoms import Atoms

    made: list = []
    binary = Atoms.binary

    def recording(self, *args, **kwargs):
        u2 = binary(self, *args, **kwargs)
        made.append(weakref.ref(u2))
        return u2

    monkeypatch.setattr(Atoms, "binary", recording)
    torch.manual_seed(0)
    model = folnet.build_model("jmc.atp", preset="tiny", head="pretraining", vocab_size=V,
                               dropout=0.1).train()
    alive = {}
    for checkpointing in (False, True):
        model.set_activation_checkpointing(checkpointing)
        made.clear()
        loss = model(**_batch("encoder")).loss
        gc.collect()
        alive[checkpointing] = sum(r() is not None for r in made)
        assert made
        loss.backward()
    assert alive == {False: 1, True: 0}
