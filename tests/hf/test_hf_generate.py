"""Generation through transformers' GenerationMixin: what a user does with GPT-2 works the same
on a FOLNet decoder (and the encoder-decoder through ``generate``), with folnet's row cache as
the past state. A tiny GPT-2 built from a config (nothing downloaded) is the anchor: the same
calls run on both."""

from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers", reason="the [hf] extra is not installed")

from tolerances import assert_close  # noqa: E402

import folnet  # noqa: E402
import folnet.hf  # noqa: E402  (registers the Auto classes)
from folnet.hf import FolnetForCausalLM, FolnetForConditionalGeneration  # noqa: E402
from folnet.hf.text import FolnetCache  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

V = 120
TEXTS = ["alice is the mother of bob", "bob and carol went home", "the cat sat on the mat",
         "carol is bob's sister"] * 30


def _peaked(model):
    """Weights scaled up so that greedy tokens lead their runner-up clearly (no near-ties)."""
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(6.0)
    return model


@pytest.fixture(scope="module")
def decoder_dir(tmp_path_factory):
    """A tokenizer and a tiny FOLNet decoder in one directory, as a user's run leaves them."""
    from folnet.train.data.tokenizer import train_tokenizer

    work = tmp_path_factory.mktemp("dec")
    train_tokenizer(texts=TEXTS, vocab_size=V).save(work)
    torch.manual_seed(0)
    _peaked(folnet.build_model("jmc.atp", kind="decoder", preset="tiny", vocab_size=V,
                               dropout=0.0)).save_pretrained(work)
    return work


@pytest.fixture(scope="module")
def encdec_dir(tmp_path_factory):
    work = tmp_path_factory.mktemp("encdec")
    torch.manual_seed(1)
    _peaked(folnet.build_model("jmc.atp", kind="encoder-decoder", preset="tiny", vocab_size=V,
                               dropout=0.0)).save_pretrained(work)
    return work


@pytest.fixture(scope="module")
def gpt2():
    """The anchor: a tiny GPT-2 from a config."""
    config = transformers.GPT2Config(vocab_size=V, n_positions=64, n_embd=32, n_layer=2,
                                     n_head=2, pad_token_id=0)
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(config).eval()


def _prompts(B=2, T=6, seed=0):
    return torch.randint(5, V, (B, T), generator=torch.Generator().manual_seed(seed))


def test_the_text_classes_can_generate_and_have_a_generation_config(decoder_dir, encdec_dir):
    for directory, auto in ((decoder_dir, "AutoModelForCausalLM"),
                            (encdec_dir, "AutoModelForSeq2SeqLM")):
        model = getattr(transformers, auto).from_pretrained(directory)
        assert model.can_generate()
        assert isinstance(model.generation_config, transformers.GenerationConfig)
    assert model.config.is_encoder_decoder and model.generation_config.decoder_start_token_id == 0


@pytest.mark.parametrize("padded", [False, True])
def test_greedy_through_transformers_equals_native_greedy(decoder_dir, padded):
    hf = transformers.AutoModelForCausalLM.from_pretrained(decoder_dir).eval()
    native = folnet.from_pretrained(decoder_dir).eval()
    ids = _prompts()
    mask = torch.ones_like(ids)
    if padded:  # row 1 left-padded by two
        ids[1, :2] = 0
        mask[1, :2] = 0
    want = native.generate(ids, 10, attention_mask=mask)
    got = hf.generate(input_ids=ids, attention_mask=mask, max_new_tokens=10)
    assert torch.equal(got, want)
    # left padding is neutral: row 1 gets the tokens it gets alone
    alone = hf.generate(input_ids=ids[1:, 2 if padded else 0 :], max_new_tokens=10)
    assert torch.equal(got[1, -10:], alone[0, -10:])


def test_greedy_encoder_decoder_equals_native(encdec_dir):
    hf = transformers.AutoModelForSeq2SeqLM.from_pretrained(encdec_dir).eval()
    native = folnet.from_pretrained(encdec_dir).eval()
    ids = _prompts(T=7, seed=1)
    mask = torch.ones_like(ids)
    mask[0, :3] = 0  # a padded input row
    want = native.generate(ids, 8, attention_mask=mask)
    got = hf.generate(input_ids=ids, attention_mask=mask, max_new_tokens=8)
    assert torch.equal(got, want)


@pytest.mark.parametrize("kind", ["decoder", "encoder-decoder"])
def test_beam_search_one_beam_is_greedy_and_the_cache_equals_recomputation(
        decoder_dir, encdec_dir, kind):
    directory = decoder_dir if kind == "decoder" else encdec_dir
    auto = "AutoModelForCausalLM" if kind == "decoder" else "AutoModelForSeq2SeqLM"
    hf = getattr(transformers, auto).from_pretrained(directory).eval()
    ids = _prompts(B=3, seed=2)
    greedy = hf.generate(ids, max_new_tokens=8)
    assert torch.equal(hf.generate(ids, max_new_tokens=8, num_beams=1), greedy)
    assert torch.equal(hf.generate(ids, max_new_tokens=8, use_cache=False), greedy)
    beams = hf.generate(ids, max_new_tokens=8, num_beams=3, num_return_sequences=2)
    # the cache, reordered at every step, gives what recomputing every beam gives
    assert torch.equal(beams, hf.generate(ids, max_new_tokens=8, num_beams=3,
                                          num_return_sequences=2, use_cache=False))
    assert beams.shape[0] == 6


@pytest.mark.numerics
def test_scores_are_the_models_own_logits(decoder_dir):
    hf = transformers.AutoModelForCausalLM.from_pretrained(decoder_dir).eval()
    ids = _prompts()
    out = hf.generate(ids, max_new_tokens=6, return_dict_in_generate=True, output_scores=True,
                      output_logits=True)
    assert len(out.scores) == 6 and out.sequences.shape == (2, 12)
    with torch.no_grad():
        full = hf(out.sequences[:, :-1]).logits[:, 5:]  # (B, 6, V) without a cache
    # the cached rows against one full forward: rounding apart
    assert_close(torch.stack(out.logits, 1), full, rtol=0, atol=1e-4,
                 what="cached logits against a forward")


def test_sampling_options_and_generation_config(decoder_dir, gpt2):
    hf = transformers.AutoModelForCausalLM.from_pretrained(decoder_dir).eval()
    ids = _prompts()
    config = transformers.GenerationConfig(max_new_tokens=7, do_sample=True, top_k=10,
                                           top_p=0.9, temperature=0.8, repetition_penalty=1.2,
                                           pad_token_id=0)
    for model in (gpt2, hf):  # the same call on the anchor and on folnet
        torch.manual_seed(3)
        first = model.generate(ids, generation_config=config)
        torch.manual_seed(3)
        again = model.generate(ids, generation_config=config)
        assert first.shape == (2, 13) and torch.equal(first, again)  # seeded: reproducible
    # repetition_penalty acts: greedy with a strong penalty repeats no new token
    penalised = hf.generate(ids, max_new_tokens=8, repetition_penalty=1e6)
    for row in penalised:
        new = row[6:].tolist()
        assert all(t not in row[:6].tolist() + new[:i] for i, t in enumerate(new))


def test_stopping_criteria_eos_and_streamer(decoder_dir):
    hf = transformers.AutoModelForCausalLM.from_pretrained(decoder_dir).eval()
    ids = _prompts(B=1)
    free = hf.generate(ids, max_new_tokens=10)
    eos = int(free[0, 9])  # the 4th new token
    stopped = hf.generate(ids, max_new_tokens=10, eos_token_id=eos)
    assert torch.equal(stopped[0], free[0, : stopped.shape[1]]) and stopped[0, -1] == eos

    class AfterThree(transformers.StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs):
            return torch.full((input_ids.shape[0],), input_ids.shape[1] >= 9, dtype=torch.bool)

    short = hf.generate(ids, max_new_tokens=10,
                        stopping_criteria=transformers.StoppingCriteriaList([AfterThree()]))
    assert short.shape[1] == 9

    class Collect(transformers.generation.streamers.BaseStreamer):
        def __init__(self):
            self.seen = []

        def put(self, value):
            self.seen.append(value.clone())

        def end(self):
            self.seen.append("end")

    streamer = Collect()
    hf.generate(ids, max_new_tokens=5, streamer=streamer)
    assert streamer.seen[-1] == "end" and len(streamer.seen) == 1 + 5 + 1  # prompt, tokens, end


def test_tokenizer_output_goes_straight_in_and_the_pipeline_runs(decoder_dir, gpt2):
    tokenizer = transformers.AutoTokenizer.from_pretrained(decoder_dir)
    tokenizer.padding_side = "left"
    batch = tokenizer(["alice is the", "bob"], return_tensors="pt", padding=True)
    assert "token_type_ids" in batch  # a BERT-style tokenizer gives them: the decoder ignores 0s
    hf = transformers.AutoModelForCausalLM.from_pretrained(decoder_dir).eval()
    out = hf.generate(**batch, max_new_tokens=6)
    assert out.shape == (2, batch["input_ids"].shape[1] + 6)
    with pytest.raises(folnet.FolnetError, match="token_type_ids: a FOLNet decoder has no"):
        hf(batch["input_ids"], token_type_ids=torch.ones_like(batch["input_ids"]))
    pipe = transformers.pipeline("text-generation", model=str(decoder_dir))
    text = pipe("alice is", max_new_tokens=4, do_sample=False)[0]["generated_text"]
    assert text.startswith("alice is") and len(text) > len("alice is")


def test_each_new_token_runs_one_row_per_layer(decoder_dir, monkeypatch):
    """transformers steps folnet's cache: one row per layer per new token."""
    from folnet.arch.layer import DualStreamLayer

    hf = transformers.AutoModelForCausalLM.from_pretrained(decoder_dir).eval()
    layer_class = type(next(m for m in hf.modules() if isinstance(m, DualStreamLayer)))
    seen = []
    original = layer_class.forward  # (transformers' checkpointing layer over folnet's)

    def spy(self, u1, u2, domain, **kw):
        seen.append((u1.shape[1], domain.rows is not None))
        return original(self, u1, u2, domain, **kw)

    monkeypatch.setattr(layer_class, "forward", spy)
    hf.generate(_prompts(), max_new_tokens=5)
    L = hf.config.model["L"]
    assert seen[:L] == [(6, False)] * L  # the prompt's square once
    assert seen[L:] == [(1, True)] * (4 * L)  # then one query row per layer and token


@pytest.mark.numerics
def test_the_cache_grows_and_reorders():
    torch.manual_seed(4)
    native = folnet.build_model("j.at", kind="decoder", preset="tiny", vocab_size=V).eval()
    ids = _prompts(B=2, T=3)
    with torch.no_grad():
        logits, session = native.begin(ids)  # capacity 6, grown as needed
        cache = FolnetCache(session)
        steps = [session.step(torch.full((2, 1), 7 + i)) for i in range(9)]
        assert session.cache.capacity >= 12 and cache.get_seq_length() == 12
        recomputed = native(torch.cat([ids, torch.arange(7, 16).expand(2, 9)], 1)).logits
    assert_close(torch.cat([logits, *steps], 1), recomputed, rtol=0, atol=1e-5,
                 what="grown cache against a forward")
    cache.reorder_cache(torch.tensor([1, 1, 0]))  # three rows now: beams of row 1 and 0
    with torch.no_grad():
        nxt = session.step(torch.full((3, 1), 20))
    assert nxt.shape == (3, 1, V) and torch.equal(nxt[0], nxt[1])


def test_native_generate_keeps_working_on_the_hf_classes_weights(decoder_dir):
    hf = FolnetForCausalLM.from_pretrained(decoder_dir).eval()
    ids = _prompts()
    assert torch.equal(hf.native.generate(ids, 6), hf.generate(ids, max_new_tokens=6))
    assert issubclass(FolnetForConditionalGeneration, transformers.GenerationMixin)
