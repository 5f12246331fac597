"""``torch.compile`` of one cached decoding step of the text classes, beside GPT-2: the step
(forward with a `FolnetCache`) is one graph without breaks -- input values are checked in
eager mode only (`folnet.arch.inputs.values_checked`), so bad ids are still refused there --
and the compiled steps give the eager logits, compiling three graphs for a whole generation:
the first step, the next with the length made dynamic, and the step that grows the cache."""

from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers", reason="the [hf] extra is not installed")

from tolerances import assert_close  # noqa: E402

import folnet  # noqa: E402
from folnet.hf import FolnetConfig, FolnetForCausalLM, FolnetForConditionalGeneration  # noqa: E402
from folnet.hf.text import CACHE  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

V = 100


@pytest.fixture
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _folnet(kind):
    torch.manual_seed(0)
    native = folnet.build_model("jmc.atp", kind=kind, preset="tiny", vocab_size=V, dropout=0.0)
    cls = FolnetForCausalLM if kind == "decoder" else FolnetForConditionalGeneration
    model = cls(FolnetConfig.from_folnet(native.cfg, head="lm")).eval()
    model.load_state_dict(native.state_dict())
    return model


def _gpt2():
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(transformers.GPT2Config(
        n_embd=32, n_layer=2, n_head=2, vocab_size=V, bos_token_id=0, eos_token_id=None)).eval()


def _prompt(T=6):
    return torch.randint(5, V, (1, T), generator=torch.Generator().manual_seed(0))


def _started(model, ids):
    """The prompt's forward (eager): its cache, for the steps that follow."""
    if model.config.is_encoder_decoder:
        out = model(ids, decoder_input_ids=torch.zeros(1, 1, dtype=torch.long), use_cache=True)
    else:
        out = model(ids, use_cache=True)
    return getattr(out, CACHE), out.logits[:, -1:].argmax(-1)  # (1, 1) the next token


def _step(model):
    key = "decoder_input_ids" if model.config.is_encoder_decoder else "input_ids"
    return lambda token, cache: model(**{key: token, CACHE: cache, "use_cache": True})


@pytest.mark.parametrize("name", ["gpt2", "folnet decoder", "folnet encoder-decoder"])
def test_a_cached_step_is_one_graph_without_breaks(fresh_dynamo, name):
    model = _gpt2() if name == "gpt2" else _folnet(name.split()[1])
    with torch.no_grad():
        cache, token = _started(model, _prompt())
        explained = torch._dynamo.explain(_step(model))(token, cache)
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), \
        [b.reason for b in explained.break_reasons]
    if name != "gpt2":  # and the step that grows the cache
        session = cache.session
        with torch.no_grad():
            session.step(torch.full((1, session.cache.capacity - session.length - 1), 7))
            before = session.cache.capacity
            explained = torch._dynamo.explain(_step(model))(token, cache)
        assert (explained.graph_count, explained.graph_break_count) == (1, 0), \
            [b.reason for b in explained.break_reasons]
        assert session.cache.capacity == 2 * before


@pytest.mark.slow(seconds=15)
@pytest.mark.numerics
@pytest.mark.parametrize("kind", ["decoder"])  # the encoder-decoder's step: one graph above
def test_compiled_steps_give_the_eager_logits_in_three_graphs(fresh_dynamo, kind):
    """14 steps from a 6-token prompt: the cache (12 positions) grows once. aot_eager traces
    as inductor does (dynamo, then AOT autograd's functional graph) without generating code
    (minutes on 2 cores); benchmarks/generate.py --compiled times inductor."""
    from torch._dynamo.utils import counters

    counters.clear()  # (torch._dynamo.reset keeps them)
    model = _folnet(kind)
    compiled = torch.compile(_step(model), fullgraph=True, backend="aot_eager")
    runs = []
    for step in (_step(model), compiled):
        with torch.no_grad():
            cache, token = _started(model, _prompt())
            logits = []
            for _ in range(14):
                logits.append(step(token, cache).logits)  # (1, 1, V)
                token = logits[-1].argmax(-1)
        runs.append(torch.cat(logits, 1))
    # the same operations, traced: rounding apart (measured 0 here)
    assert_close(runs[1], runs[0], rtol=0, atol=1e-5, what=f"compiled {kind} steps")
    assert torch.equal(runs[1].argmax(-1), runs[0].argmax(-1))
    assert counters["stats"]["unique_graphs"] == 3


def test_bad_ids_are_still_refused_in_eager_mode():
    decoder, encdec = _folnet("decoder"), _folnet("encoder-decoder")
    with torch.no_grad():
        cache, _ = _started(decoder, _prompt())
        with pytest.raises(folnet.FolnetError, match=r"input_ids contain id 100, outside the "
                                                     r"vocabulary: ids must be in \[0, "
                                                     r"vocab_size = 100\)"):
            decoder(torch.tensor([[100]]), **{CACHE: cache})
        with pytest.raises(folnet.FolnetError, match="input_ids contain id -1"):
            decoder(torch.tensor([[3, -1]]), use_cache=True)
        with pytest.raises(folnet.FolnetError, match="token_type_ids: a FOLNet decoder has no"):
            decoder(_prompt(), token_type_ids=torch.ones(1, 6, dtype=torch.long),
                    use_cache=True)
        cache, _ = _started(encdec, _prompt())
        with pytest.raises(folnet.FolnetError, match="decoder_input_ids contain id 250"):
            encdec(decoder_input_ids=torch.tensor([[250]]), **{CACHE: cache})
        with pytest.raises(folnet.FolnetError, match="input_ids contain id 100"):
            encdec(torch.tensor([[100, 5]]), decoder_input_ids=torch.zeros(1, 1, dtype=int),
                   use_cache=True)
    assert cache.get_seq_length() == 1  # the refused step left the cache as it was
