"""`folnet.ops.primitives.device.emulate`: a CPU run that makes every kernel choice a CUDA device
makes (what benchmarks/step_census.py counts as the CUDA path), and nothing else."""

from __future__ import annotations

import pytest
import torch

import folnet
from folnet.errors import FolnetError
from folnet.ops.primitives.device import emulate, kernel_device


def test_choices_follow_the_emulated_device_and_come_back():
    j = folnet.compile_operator("j", "auto")
    call = j.describe_call(torch.zeros(1), padded=False, requires_grad=True)
    assert kernel_device(torch.device("cpu")) == "cpu"
    assert j.select(call).name == "fused"
    with emulate("cuda"):
        assert kernel_device("cpu") == "cuda"
        # xformers is first on CUDA; without it installed (here), einsum
        assert j.select(call).name in ("xformers", "einsum")
        with emulate("cpu"):
            assert j.select(call).name == "fused"
        assert kernel_device("cpu") == "cuda"
    assert kernel_device("cpu") == "cpu" and j.select(call).name == "fused"


def test_an_emulated_cuda_step_computes_the_cpu_steps_function():
    """Other kernels, the same function: loss and gradients agree at float32 rounding."""
    torch.manual_seed(0)
    model = folnet.build_model("jmc.atp", preset="tiny", head="pretraining", vocab_size=50,
                               dropout=0.0)
    x = torch.randint(1, 50, (2, 9), generator=torch.Generator().manual_seed(3))
    results = []
    for device in ("cpu", "cuda"):
        model.zero_grad()
        with emulate(device):
            loss = model(x, mlm_labels=x, nsp_labels=torch.tensor([0, 1])).loss
            loss.backward()
        results.append((loss.detach(), model.encoder.layers[0].proj_b.weight.grad.clone()))
    (l0, g0), (l1, g1) = results
    assert torch.allclose(l0, l1, rtol=1e-5, atol=0) and torch.allclose(g0, g1, rtol=1e-4,
                                                                         atol=1e-7)


def test_an_unknown_device_is_refused_by_name():
    with pytest.raises(FolnetError, match=r"emulate: device_type 'tpu' is unknown; use 'cpu'"):
        with emulate("tpu"):
            pass


def _ops(fn) -> set[str]:
    from torch.utils._python_dispatch import TorchDispatchMode

    seen: set[str] = set()

    class Seen(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.add(func.overloadpacket.__name__)
            return func(*args, **(kwargs or {}))

    with Seen():
        fn()
    return seen


def test_on_cuda_dropout_is_torchs_own_kernel_unless_masks_are_asked_for():
    """The CUDA path drops out with ``native_dropout`` (one kernel each way); the keep masks
    (a random word per four elements) on the CPU, and on CUDA inside `portable_masks`."""
    from folnet.ops.primitives.dropout import dropout, dropout_add, portable_masks

    x = torch.randn(64, 64, requires_grad=True)
    r = torch.randn(64, 64)

    def step():
        (dropout(x, 0.25, True) + dropout_add(r, x, 0.25, True)).sum().backward()

    with emulate("cuda"):
        native = _ops(step)
        with portable_masks():
            portable = _ops(step)
    assert {"native_dropout", "native_dropout_backward"} <= native and "random_" not in native
    assert "random_" in portable and "native_dropout" not in portable
    assert "random_" in _ops(step)  # the CPU's own choice
    with emulate("cuda"):  # inverted dropout: kept elements scaled by 1/(1-p), the rest 0
        torch.manual_seed(0)
        y = dropout(torch.ones(200, 200), 0.25, True)
    kept = y != 0
    assert torch.all(y[kept] == 1 / 0.75) and abs(float(kept.float().mean()) - 0.75) < 0.01
