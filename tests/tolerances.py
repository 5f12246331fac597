"""How the tests compare numbers, and a record of how close every comparison came.

The rule (docs/design.md section 9):

* ``torch.equal`` -- bit for bit -- only between two computations made by this process on this
  machine that are meant to be identical: a resumed run against an uninterrupted one, cached
  against recomputed, a saved and reloaded model against the one saved, one input format
  against another. Weights read back from a file are data, not arithmetic: they are also
  compared bit for bit.
* Anything computed and then stored in a file -- the released fixture's reference outputs, the
  legacy checkpoints' outputs -- is another machine's arithmetic: another CPU's vector kernels
  round differently (measured on float32 logits: up to 3.9e-6 absolute between an AVX2 and an
  AVX-512/AMX machine). Such outputs are compared with `assert_stored`, at `STORED_REL`.
* Every bound leaves a margin of 10x over what two CPU kernel sets measure: `make test` runs
  the tests marked ``numerics`` (and not ``slow``) a second time under torch's non-vectorised
  kernels with oneDNN held to SSE4.1, and ``make tolerances`` runs all of them on both and
  prints each comparison's measured error against its bound (`tests/tolerance_report.py`). A
  bound that cannot have that margin says why, from the arithmetic, next to it.

Every helper here asserts, and when ``FOLNET_TOLERANCE_LOG`` names a file it appends one JSON
line per comparison (the test, what was compared, the error measured and the bound), which is
how the margins above are measured rather than guessed.
"""

from __future__ import annotations

import json
import os

import torch

#: float32 outputs against outputs stored in a file by another machine: the relative error in
#: norm, ||got - want|| / ||want||. Measured up to 4.3e-7 between kernel sets (the released
#: fixture and the legacy checkpoints; docs/design.md section 9 lists them).
STORED_REL = 1e-5


def rel_error(got: torch.Tensor, want: torch.Tensor) -> float:
    """||got - want|| / ||want|| in float64 (the plain norm of the difference when want is 0)."""
    got, want = got.detach().double().cpu(), want.detach().double().cpu()
    scale = float(want.norm())
    diff = float((got - want).norm())
    return diff / scale if scale > 0 else diff


def _record(what: str, metric: str, measured: float, bound: float) -> None:
    path = os.environ.get("FOLNET_TOLERANCE_LOG")
    if not path:
        return
    test = os.environ.get("PYTEST_CURRENT_TEST", "?").rsplit(" ", 1)[0]
    line = {"test": test, "what": what, "metric": metric, "measured": measured, "bound": bound,
            "kernels": os.environ.get("ATEN_CPU_CAPABILITY", "native")}
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(line) + "\n")


def assert_rel(got: torch.Tensor, want: torch.Tensor, bound: float, what: str) -> float:
    """Assert ``rel_error(got, want) <= bound``; returns the error."""
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    err = rel_error(got, want)
    _record(what, "rel", err, bound)
    assert err <= bound, f"{what}: relative error {err:.3g} above {bound:.0e}"
    return err


#: Two bf16 computations of one quantity (row blocks against the whole square, both under
#: autocast) differ by where each rounds to 8 bits, and how far such roundings move a result
#: depends on the result: a gradient that is a small difference of large terms moves by many
#: times bf16's 2^-8 (the NSP weight's of a two-row batch whose pooled rows nearly agree and
#: whose labels differ: 0.10 from float32 on its own, Intel Xeon). A fixed relative bound is
#: then either loose everywhere else or, as 1e-1 was, exceeded on another CPU (0.142, AMD EPYC
#: with AVX2 only). So a bf16 comparison is bounded per tensor in units of the distance bf16
#: itself puts between ``want`` and its float32 ``reference``: the two computations make the
#: same roundings in other places, so they differ by about that distance (up to 1.4x of it
#: measured on the two CPUs above), and 20x leaves more than a 10x margin over it. A wrong
#: mask, cast or block is off by O(1) on well-conditioned tensors, whose own distance is
#: ~5e-3: far outside 20x that.
BF16_UNITS = 20.0
#: ... and no smaller than 20 roundings' worth (a result bf16 does not move at all).
BF16_FLOOR = BF16_UNITS * 2.0**-9


def assert_bf16_rel(got: torch.Tensor, want: torch.Tensor, reference: torch.Tensor,
                    what: str) -> float:
    """Assert ``rel_error(got, want)`` is within `BF16_UNITS` times ``rel_error(want,
    reference)`` (``want`` a bf16 computation, ``reference`` the same in float32), floored at
    `BF16_FLOOR`; records the share of that bound used. Returns the error."""
    assert got.shape == want.shape == reference.shape, (
        f"{what}: shapes {tuple(got.shape)}, {tuple(want.shape)}, {tuple(reference.shape)}")
    own = rel_error(want, reference)
    bound = max(BF16_UNITS * own, BF16_FLOOR)
    err = rel_error(got, want)
    _record(what, "bf16 rel", err, bound)
    assert err <= bound, (f"{what}: relative error {err:.3g} above {bound:.3g} ({BF16_UNITS:g}x "
                          f"the {own:.3g} bf16 itself puts between the compared result and "
                          f"float32's)")
    return err


def assert_close(got: torch.Tensor, want: torch.Tensor, *, rtol: float, atol: float,
                 what: str) -> float:
    """Assert ``|got - want| <= atol + rtol |want|`` everywhere (torch.testing's test, with the
    bound always stated). Returns, and records, the largest share of its bound an element used
    (1 is the bound itself)."""
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    g, w = got.detach().double().cpu(), want.detach().double().cpu()
    diff, bound = (g - w).abs(), atol + rtol * w.abs()
    # an element whose bound is 0 (rtol only, want 0) may only be exact
    share = torch.where(bound > 0, diff / bound.clamp_min(1e-300),
                        torch.where(diff > 0, torch.inf, 0.0))
    used = float(share.max()) if g.numel() else 0.0
    _record(what, f"rtol {rtol:.0e} atol {atol:.0e}", used, 1.0)
    assert used <= 1.0, (f"{what}: max |difference| {float((g - w).abs().max()):.3g} is "
                         f"{used:.2f}x the bound (rtol {rtol:.0e}, atol {atol:.0e})")
    return used


def assert_at_most(measured: float, bound: float, what: str) -> float:
    """Assert a difference measured another way (weights of two runs, two loss curves) is at
    most ``bound``; recorded like the others."""
    measured = float(measured)
    _record(what, "at most", measured, bound)
    assert measured <= bound, f"{what}: {measured:.3g} above {bound:.0e}"
    return measured


def assert_stored(got: torch.Tensor, want: torch.Tensor, what: str) -> float:
    """A float output against one stored in a file (computed elsewhere): `STORED_REL`."""
    return assert_rel(got, want, STORED_REL, what)


def assert_tokens_lead(logits: torch.Tensor, tokens: torch.Tensor, what: str,
                       gap: float = 1e-4) -> None:
    """Greedy tokens against tokens chosen by another computation (stored in a file, or
    recomputed another way). Tokens are exact only where no two logits tie within the two
    computations' rounding: each of ``tokens`` (B, N) must be the argmax of its ``logits``
    (B, N, V) and lead the runner-up by ``gap`` (1e-4: 10x the largest logit difference these
    tests allow between two float32 computations, 1e-5; 25x the largest measured between two
    machines' kernels, 3.9e-6)."""
    top = logits.double().topk(2, dim=-1)
    assert torch.equal(top.indices[..., 0], tokens), f"{what}: tokens differ from the stored ones"
    lead = float((top.values[..., 0] - top.values[..., 1]).min())
    _record(what, "token lead", gap / max(lead, 1e-300), 1.0)
    assert lead >= gap, f"{what}: a token leads its runner-up by only {lead:.3g} (< {gap:g})"
