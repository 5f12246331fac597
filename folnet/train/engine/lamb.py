"""LAMB, the FOLNet recipe's optimiser (paper Table 6), in a few dozen launches per step.

The rule (You et al., ICLR 2020, Algorithm 2), per parameter tensor:

    m = b1 m + (1 - b1) g            v = b2 v + (1 - b2) g^2
    r = (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps) + wd w
    w = w - lr * (||w|| / ||r||) * r            (ratio 1 when either norm is 0)

Why not `pytorch_optimizer.Lamb` (4.1): it is not the published rule (no bias correction of
the second moment, the weight norm clamped at 10, eps added to the update norm, decoupled
weight decay). Why not a loop over the tensors: it launches a score of ops per tensor, and
over the base model's tensors that is more launches than the whole forward and backward pass
(docs/results/measurements.md).

How it is made few: the tensors of one device and dtype form a *bucket* whose moments live in
one flat buffer each (every tensor's ``exp_avg`` and ``exp_avg_sq`` in the optimiser state is
a view of its slice, the layout torch's optimisers and older folnet checkpoints have), so
each line of the rule is one elementwise op over the bucket; the per-tensor norms are one
``_foreach_norm`` each, the trust ratios one small vector, spread back over the elements by
one ``repeat_interleave``. About 30 ops per bucket, whatever the number of tensors; on a CPU
every result is the bits of the per-tensor loop (`step_reference`, the rule as written above,
which FSDP's sharded DTensors still take: their norms are global reductions).

A step can be *skipped on the device* (``step(skip=flag)``, a 0-dim bool tensor): the
gradients are read as zeros, the moments and the step count keep their values and the
weights move by zero -- no host sync, so a training loop can judge a step non-finite without
waiting for its loss (`folnet.train.pretrain.loop`). The step count is a float64 tensor per
bucket for that reason (float64: ``1 - b^t`` then has the bits the host's float arithmetic
gives).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch.optim import Optimizer

from folnet.errors import FolnetError

__all__ = ["Lamb"]

_LOW = (torch.float16, torch.bfloat16)


def _sharded(p: torch.Tensor) -> bool:
    """A DTensor (FSDP's sharded parameter): its norms must be reduced over the ranks."""
    return hasattr(p, "to_local")


@dataclass
class _Bucket:
    """Tensors of one device and dtype stepped together: their flat moments (in that dtype;
    float32 for half types) with
    each tensor's view of them (the optimiser state's ``exp_avg``, ``exp_avg_sq``), one step
    count, and where each group's tensors sit."""

    params: list[torch.Tensor]
    groups: list[tuple[dict[str, Any], int, int]]  # (group, first tensor, end), in order
    exp_avg: torch.Tensor  # (N,)
    exp_avg_sq: torch.Tensor  # (N,)
    step: torch.Tensor  # () float64, shared by the tensors' states
    sizes: list[int]
    repeats: torch.Tensor  # (n,) int64: each tensor's element count, on the device
    m_views: list[torch.Tensor]
    v_views: list[torch.Tensor]
    _constants: tuple[torch.Tensor, torch.Tensor] | None = None

    def constants(self) -> tuple[torch.Tensor, torch.Tensor]:
        """() 1 and (2,) the betas, on the device in the moments' dtype, made once: a Python
        number in ``torch.where`` is one more launch per step."""
        if self._constants is None:
            beta = self.groups[0][0]["betas"]
            self._constants = (torch.ones((), dtype=self.exp_avg.dtype,
                                          device=self.exp_avg.device),
                               torch.tensor(beta, dtype=self.exp_avg.dtype,
                                            device=self.exp_avg.device))
        return self._constants

    def views(self, flat: torch.Tensor) -> list[torch.Tensor]:
        """``flat`` (N,) cut into one view per tensor, shaped like it."""
        return [t.view_as(p) for t, p in zip(flat.split(self.sizes), self.params, strict=True)]

    def holds(self, params: list[torch.Tensor], state: dict) -> bool:
        """Whether these tensors, in this order, are this bucket's and their state is its."""
        return len(params) == len(self.params) and all(
            a is b and state[a].get("exp_avg") is m and state[a].get("step") is self.step
            for a, b, m in zip(params, self.params, self.m_views, strict=True))


class Lamb(Optimizer):
    """LAMB (You et al. 2020): Adam moments with bias correction and a per-tensor trust
    ratio. ``weight_decay`` enters the update ``r`` (so it is scaled by the trust ratio, as in
    the paper), not the gradient moments. Half-precision parameters are updated in float32
    (moments stay float32). Tensors without a gradient are not stepped (their moments and step
    count stay), as in a loop over the tensors."""

    def __init__(self, params: Iterable[Any], lr: float = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-6,
                 weight_decay: float = 0.0) -> None:
        if not lr >= 0.0:
            raise FolnetError(f"Lamb lr must be >= 0, got {lr!r}")
        for i, beta in enumerate(betas):
            if not 0.0 <= beta < 1.0:
                raise FolnetError(f"Lamb betas[{i}] must lie in [0, 1), got {beta!r}")
        if not eps >= 0.0:
            raise FolnetError(f"Lamb eps must be >= 0, got {eps!r}")
        if not weight_decay >= 0.0:
            raise FolnetError(f"Lamb weight_decay must be >= 0, got {weight_decay!r}")
        defaults = {"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay}
        super().__init__(params, defaults)
        self._buckets: dict[tuple, _Bucket] = {}

    # -- the step ------------------------------------------------------------------------------
    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None, *,
             skip: torch.Tensor | None = None) -> Any:
        """One update of every parameter with a gradient; ``skip`` (a 0-dim bool tensor on
        their device): when true, nothing moves (see the module's docstring)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        flat: dict[tuple, list[tuple[dict[str, Any], torch.Tensor]]] = {}
        sharded = []
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise FolnetError("Lamb does not support sparse gradients")
                if _sharded(p):
                    sharded.append((group, p))
                else:  # tensors stepped together so far share one step count
                    step = self.state[p].get("step")
                    key = (p.device, p.dtype, _hyper(group), None if step is None else id(step))
                    flat.setdefault(key, []).append((group, p))
        for key, members in flat.items():
            self._step_bucket(self._bucket(key, members), skip)
        for group, p in sharded:
            self.step_reference(group, p, skip)
        return loss

    def _step_bucket(self, b: _Bucket, skip: torch.Tensor | None) -> None:
        group0 = b.groups[0][0]
        beta1, beta2 = group0["betas"]
        eps = group0["eps"]
        grads = [p.grad for p in b.params]
        m_views, v_views = b.m_views, b.v_views
        if skip is None:
            factor1, factor2 = beta1, beta2
            b.step.add_(1)
            g = None
        else:  # (N,) the gradients, or zeros when the step is skipped
            g = torch.cat([x.reshape(-1) for x in grads])
            g = (g.float() if g.dtype in _LOW else g).masked_fill_(skip, 0.0)
            grads = None
            one, beta = b.constants()
            factor1 = torch.where(skip, one, beta[0])  # () b or 1: m, v kept
            factor2 = torch.where(skip, one, beta[1])
            b.step.add_(~skip)
        m, v = b.exp_avg, b.exp_avg_sq  # (N,)
        m.mul_(factor1)
        v.mul_(factor2)
        if g is None:  # the gradients as they are: one foreach op per moment
            grads = [x.float() if x.dtype in _LOW else x for x in grads]
            torch._foreach_add_(m_views, grads, alpha=1.0 - beta1)
            torch._foreach_addcmul_(v_views, grads, grads, value=1.0 - beta2)
        else:
            m.add_(g, alpha=1.0 - beta1)
            v.addcmul_(g, g, value=1.0 - beta2)
            del g
        correction1 = 1.0 - torch.pow(beta1, b.step)  # () float64
        correction2 = 1.0 - torch.pow(beta2, b.step)
        denominator = torch.div(v, correction2)  # (N,)
        denominator.sqrt_().add_(eps)
        update = torch.div(m, correction1).div_(denominator)  # (N,): r
        del denominator
        views = b.views(update)
        weights = [p.float() if p.dtype in _LOW else p for p in b.params]
        for group, i0, i1 in b.groups:
            if group["weight_decay"] != 0.0:
                torch._foreach_add_(views[i0:i1], weights[i0:i1], alpha=group["weight_decay"])
        w_norm = torch.stack(torch._foreach_norm(weights))  # (n,)
        r_norm = torch.stack(torch._foreach_norm(views))
        usable = (w_norm > 0) & (r_norm > 0)
        ratio = torch.where(usable, w_norm / r_norm, b.constants()[0])  # (n,)
        for group, i0, i1 in b.groups:  # -lr x ratio, per group's tensors
            ratio[i0:i1].mul_(-group["lr"])
        if skip is not None:
            ratio.masked_fill_(skip, 0.0)
        update.mul_(torch.repeat_interleave(ratio, b.repeats, output_size=update.numel()))
        if b.params[0].dtype in _LOW:
            views = [u.to(p.dtype) for u, p in zip(views, b.params, strict=True)]
        torch._foreach_add_(b.params, views)

    def step_reference(self, group: dict[str, Any], p: torch.Tensor,
                       skip: torch.Tensor | None = None) -> None:
        """The rule for one tensor, as the module's docstring writes it (FSDP's DTensors,
        whose norms are reductions over the ranks, and the tests' reference)."""
        beta1, beta2 = group["betas"]
        low = p.dtype in _LOW
        grad = p.grad.float() if low else p.grad
        state = self.state[p]
        if not state:
            state["step"] = torch.zeros((), dtype=torch.float64, device=_local(p).device)
            state["exp_avg"] = torch.zeros_like(p, dtype=grad.dtype)
            state["exp_avg_sq"] = torch.zeros_like(p, dtype=grad.dtype)
        state["step"] = _as_step(state["step"], _local(p).device)
        keep = None if skip is None else (~skip).to(torch.float64)
        if skip is not None:
            grad = torch.where(skip, 0.0, grad)
        # out of place: after a load_state_dict tensors of equal counts share one step tensor
        # (for the buckets), and an in-place add here would count each of them on all of them
        state["step"] = state["step"] + (1 if keep is None else keep)
        t = state["step"]
        m, v = state["exp_avg"], state["exp_avg_sq"]
        m.mul_(beta1 if skip is None else torch.where(skip, 1.0, beta1).float())
        m.add_(grad, alpha=1.0 - beta1)
        v.mul_(beta2 if skip is None else torch.where(skip, 1.0, beta2).float())
        v.addcmul_(grad, grad, value=1.0 - beta2)
        m_hat = m / (1.0 - torch.pow(beta1, t))
        v_hat = v / (1.0 - torch.pow(beta2, t))
        weight = p.float() if low else p
        update = m_hat / (v_hat.sqrt() + group["eps"])  # r, same shape as p
        if group["weight_decay"] != 0.0:
            update.add_(weight, alpha=group["weight_decay"])
        w_norm = torch.linalg.vector_norm(weight)  # () global norm, even when sharded
        r_norm = torch.linalg.vector_norm(update)
        usable = (w_norm > 0) & (r_norm > 0)
        # No host sync: the branch of the rule is a select on device.
        ratio = torch.where(usable, w_norm / torch.where(usable, r_norm, 1.0), 1.0)
        scale = -group["lr"] * ratio
        if keep is not None:
            scale = scale * keep.float()
        p.add_((update * scale).to(p.dtype))

    # -- the buckets -----------------------------------------------------------------------------
    def _bucket(self, key: tuple, members: list[tuple[dict[str, Any], torch.Tensor]]
                ) -> _Bucket:
        """The bucket of these tensors, made (or made again) when it is not the one their
        state already lives in: the first step, a changed set of tensors with gradients (a
        new step count then: the tensors left out keep theirs), or a state loaded from a
        checkpoint (separate tensors)."""
        params = [p for _, p in members]
        old = self._buckets.get(key)
        if old is not None and old.holds(params, self.state):
            return old
        device = params[0].device
        sizes = [p.numel() for p in params]
        dtype = torch.float32 if params[0].dtype in _LOW else params[0].dtype
        exp_avg = torch.zeros(sum(sizes), dtype=dtype, device=device)
        exp_avg_sq = torch.zeros_like(exp_avg)
        step = self.state[params[0]].get("step")  # shared by all of them (the key says so)
        step = (torch.zeros((), dtype=torch.float64, device=device) if step is None
                else _as_step(step, device).clone())
        groups: list[tuple[dict[str, Any], int, int]] = []
        for at, (group, _) in enumerate(members):
            if groups and groups[-1][0] is group:
                groups[-1] = (group, groups[-1][1], at + 1)
            else:
                groups.append((group, at, at + 1))
        bucket = _Bucket(params, groups, exp_avg, exp_avg_sq, step, sizes,
                         torch.tensor(sizes, dtype=torch.int64, device=device), [], [])
        bucket.m_views, bucket.v_views = bucket.views(exp_avg), bucket.views(exp_avg_sq)
        for p, m, v in zip(params, bucket.m_views, bucket.v_views, strict=True):
            state = self.state[p]
            if state:
                m.copy_(state["exp_avg"])
                v.copy_(state["exp_avg_sq"])
            state.update(step=step, exp_avg=m, exp_avg_sq=v)
        self._buckets.pop(key, None)  # (tensors it left out keep their views of its buffers)
        self._buckets[(*key[:-1], id(step))] = bucket  # the key the next step computes
        return bucket

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a state (this optimiser's, or one saved before the buckets: separate moment
        tensors and integer steps); tensors with equal step counts then share one, so that
        they are stepped in one bucket again (one host read per tensor, here only)."""
        super().load_state_dict(state_dict)
        self._buckets.clear()
        shared: dict[tuple, torch.Tensor] = {}
        for group in self.param_groups:
            for p in group["params"]:
                state = self.state.get(p)
                if not state or "step" not in state:
                    continue
                device = _local(p).device
                count = float(state["step"])
                step = shared.setdefault((device, count), torch.full(
                    (), count, dtype=torch.float64, device=device))
                state["step"] = step


def _hyper(group: dict[str, Any]) -> tuple:
    """What must be equal for tensors to share a bucket: betas and eps (lr and weight decay
    are applied per group inside it)."""
    return tuple(group["betas"]), group["eps"]


def _local(p: torch.Tensor) -> torch.Tensor:
    return p.to_local() if _sharded(p) else p


def _as_step(step: Any, device: torch.device) -> torch.Tensor:
    """A state's step count as the () float64 tensor this optimiser keeps (checkpoints before
    the buckets hold an int)."""
    if isinstance(step, torch.Tensor):
        return step.to(device=device, dtype=torch.float64)
    return torch.tensor(float(step), dtype=torch.float64, device=device)
