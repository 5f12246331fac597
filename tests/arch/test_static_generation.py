"""The static generation cache (``generate(cache="static")``): sized for the whole generation,
each step over every position of it -- fixed shapes, so ``compile`` captures one step for the
whole generation (a CUDA graph on a GPU). It must give the dynamic cache's tokens and logits,
refuse to grow, and compile into one graph that later generations reuse."""

from __future__ import annotations

import pytest
import torch
from models import tiny_model
from tolerances import assert_close

import folnet

pytestmark = pytest.mark.usefixtures("one_thread")

V = 60


def _prompt(B=2, n=6, seed=0):
    return torch.randint(1, V, (B, n), generator=torch.Generator().manual_seed(seed))


def _runs(model, x, new, **kw):
    """Dynamic, static and static-then-sampled generations with the same arguments."""
    runs = {}
    for cache in ("dynamic", "static"):
        gen = torch.Generator().manual_seed(7) if kw.get("do_sample") else None
        runs[cache] = model.generate(x, new, generator=gen, return_logits=True, cache=cache,
                                     **kw)
    return runs["dynamic"], runs["static"]


@pytest.mark.numerics
@pytest.mark.parametrize("kind", ["decoder", "encoder-decoder"])
@pytest.mark.parametrize("sample", [False, True], ids=["greedy", "sampled"])
def test_the_static_cache_gives_the_dynamic_caches_tokens(kind, sample):
    model, x = tiny_model("jmc.atp", kind, seed=1, vocab_size=V, eval_mode=True), _prompt()
    mask = torch.ones_like(x)
    mask[1, :2] = 0  # row 1 left-padded
    kw = {"attention_mask": mask, "do_sample": sample, "temperature": 0.8}
    if kind == "decoder":
        kw["prefix_lengths"] = torch.tensor([3, 2])
    dynamic, static = _runs(model, x, 12, **kw)
    assert torch.equal(static.sequences, dynamic.sequences)
    # the same sums over more (masked) columns: rounding apart (measured <= 6e-8)
    assert_close(static.logits, dynamic.logits, rtol=0, atol=1e-5, what=f"static {kind}")


def test_a_static_cache_cannot_grow_and_bad_choices_are_named():
    model, x = tiny_model("j.at", "decoder", seed=1, vocab_size=V, eval_mode=True), _prompt()
    _, session = model.begin(x, capacity=7, static=True)
    session.step(torch.ones(2, 1, dtype=torch.long))  # position 6: the last one
    with pytest.raises(folnet.FolnetError, match=r"a static generation cache holds 7 positions "
                                                 r"and cannot grow to 8"):
        session.step(torch.ones(2, 1, dtype=torch.long))
    for kw, match in (({"cache": "paged"}, r"cache must be one of \('dynamic', 'static'\), "
                                            r"got 'paged'"),
                      ({"compile": True}, r"compile=True compiles the static cache's decoding "
                                          r"step.*pass cache='static' too"),
                      ({"cache": "static", "compile": "fast"}, r"compile must be True, False "
                                                               r"or a torch.compile mode"),
                      ({"cache": "static", "use_cache": False}, r"cache='static' is a "
                                                                r"generation cache")):
        with pytest.raises(folnet.FolnetError, match=match):
            model.generate(x, 3, **kw)


# slow: a trace per kind (4-8 s each), left out of the second kernel set's pass like the other
# traced comparisons (make tolerances runs it on both)
@pytest.mark.slow(seconds=8)
@pytest.mark.numerics
@pytest.mark.parametrize("kind", ["decoder", "encoder-decoder"])
def test_the_compiled_static_step_is_one_graph_for_every_generation(kind, monkeypatch):
    """aot_eager traces as inductor does (no code generation: seconds, not a minute):
    fullgraph, one graph for a whole generation and for the next one, the cache's tokens."""
    from torch._dynamo.utils import counters

    real = torch.compile
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: real(fn, **{**kw,
                                                                       "backend": "aot_eager"}))
    torch._dynamo.reset()
    counters.clear()
    model, x = tiny_model("jmc.atp", kind, seed=1, vocab_size=V, eval_mode=True), _prompt()
    want = model.generate(x, 10, return_logits=True)
    for _ in range(2):
        got = model.generate(x, 10, return_logits=True, cache="static", compile=True)
        assert torch.equal(got.sequences, want.sequences)
        assert_close(got.logits, want.logits, rtol=0, atol=1e-5, what=f"compiled {kind}")
    assert counters["stats"]["unique_graphs"] == 1
    torch._dynamo.reset()
