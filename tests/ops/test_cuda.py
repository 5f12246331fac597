"""The same models on CUDA: outputs and gradients match the CPU, and auto dispatch takes the
CUDA priority list (xformers or SDPA for the attention-shaped operators, einsum for the rest).
These need a GPU; on a machine without one they skip, saying so."""

from __future__ import annotations

import pytest
import torch

import folnet
from folnet.ops.backends import PRIORITY

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _pair(kind: str, ops: str, **kw):
    torch.manual_seed(0)
    cpu = folnet.build_model(ops, preset="tiny", kind=kind, vocab_size=100, dropout=0.0, **kw)
    gpu = folnet.build_model(ops, preset="tiny", kind=kind, vocab_size=100, dropout=0.0, **kw)
    gpu.load_state_dict(cpu.state_dict())
    return cpu.double(), gpu.cuda()


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().double().cpu(), b.detach().double().cpu()
    return float((a - b).norm() / b.norm())


def test_auto_takes_the_cuda_priority_list():
    _, gpu = _pair("encoder", "jmc.atp")
    layer = gpu.encoder.layers[0]
    call = layer.ops[0].call(torch.zeros(1, device="cuda"), padded=False, requires_grad=True)
    chosen = {op.spec.symbol: op.select(call).name for op in layer.ops}
    attention = PRIORITY["cuda"][0] if chosen["j"] == "xformers" else "sdpa"
    assert chosen == {"j": attention, "m": attention, "c": attention, "t": attention,
                      "a": "einsum", "p": "einsum"}


@pytest.mark.parametrize(("kind", "ops", "kw"), [
    ("encoder", "jmc.atp", {"head": "pretraining"}),
    ("encoder", "jmc.atp", {"head": "classification", "num_labels": 3, "position": "ape+rpe"}),
    ("decoder", "jmc.atp", {}),
    ("encoder-decoder", "jm.atp", {}),
])
def test_outputs_and_gradients_match_the_cpu(kind, ops, kw):
    cpu, gpu = _pair(kind, ops, **kw)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, 100, (2, 24), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 19:] = 0
    args = {"encoder": lambda d: (ids.to(d),), "decoder": lambda d: (ids.to(d),),
            "encoder-decoder": lambda d: (ids.to(d), ids[:, :9].to(d))}[kind]
    kwargs = (lambda d: {"attention_mask": mask.to(d)}) if kind != "encoder-decoder" else \
        (lambda d: {})
    outs = []
    for model, device in ((cpu, "cpu"), (gpu, "cuda")):
        out = model(*args(device), **kwargs(device))
        logits = out.logits if out.logits is not None else out.mlm_logits
        logits.float().square().mean().backward()
        outs.append((logits, {n: p.grad for n, p in model.named_parameters()}))
    assert _rel(outs[1][0], outs[0][0]) < 1e-4
    for name, grad in outs[0][1].items():
        if grad is not None and grad.norm() > 0:
            assert _rel(outs[1][1][name], grad) < 1e-3, name


def test_bf16_autocast_step_on_cuda():
    torch.manual_seed(0)
    model = folnet.build_model("jmc.atp", preset="tiny", head="pretraining", vocab_size=100).cuda()
    ids = torch.randint(5, 100, (4, 32), device="cuda")
    labels = ids.masked_fill(torch.rand(ids.shape, device="cuda") > 0.3, -100)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model(ids, mlm_labels=labels, nsp_labels=torch.zeros(4, dtype=torch.long,
                                                                    device="cuda")).loss
    loss.backward()
    assert torch.isfinite(loss) and all(torch.isfinite(p.grad).all() for p in model.parameters()
                                        if p.grad is not None)


def test_generation_cache_matches_recomputation_on_cuda():
    _, gpu = _pair("decoder", "jmc.atp")
    gpu.eval()
    x = torch.randint(5, 100, (2, 6), device="cuda")
    a = gpu.generate(x, 8, use_cache=True, return_logits=True)
    b = gpu.generate(x, 8, use_cache=False, return_logits=True)
    assert torch.equal(a.sequences, b.sequences)
    torch.testing.assert_close(a.logits, b.logits, rtol=0, atol=1e-4)
