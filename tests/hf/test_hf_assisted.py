"""Assisted decoding and prompt lookup through transformers' ``generate``: greedy with a
smaller assistant, with the model as its own assistant, or with candidates looked up in the
prompt gives greedy's tokens, token for token. Each candidate round feeds several tokens at
once and crops the cache back past the rejected ones, so these tests hold only if folnet's
crop is exact (the session's crop against recomputation: tests/arch/test_generation.py).
transformers assists a batch of one row only, GPT-2 and T5 too. A tiny GPT-2 and a tiny T5
built from configs (nothing downloaded) are the anchors: every call runs on them in the same
test."""

from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers", reason="the [hf] extra is not installed")

from tolerances import assert_close  # noqa: E402

import folnet  # noqa: E402
import folnet.hf  # noqa: E402  (registers the Auto classes)
from folnet.hf.text import FolnetCache  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

V = 100
NEW = 16


def _peaked(model, factor=6.0):
    """Weights scaled up so that greedy tokens lead their runner-up clearly (no near-ties
    that the rounding of a several-token verification step could flip)."""
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(factor)
    return model


def _folnet(tmp_path_factory, kind, ops, seed, **kw):
    """A FOLNet saved as a user's run leaves it, loaded through the Auto classes."""
    work = tmp_path_factory.mktemp(f"{kind}-{ops}")
    torch.manual_seed(seed)
    _peaked(folnet.build_model(ops, kind=kind, preset="tiny", vocab_size=V, dropout=0.0,
                               **kw)).save_pretrained(work)
    auto = "AutoModelForCausalLM" if kind == "decoder" else "AutoModelForSeq2SeqLM"
    return getattr(transformers, auto).from_pretrained(work).eval()


@pytest.fixture(scope="module")
def causal(tmp_path_factory):
    """name -> (model, a smaller assistant with the same vocabulary): the anchor and folnet."""
    def gpt2(n_layer, seed):
        torch.manual_seed(seed)
        return _peaked(transformers.GPT2LMHeadModel(transformers.GPT2Config(
            n_embd=32, n_layer=n_layer, n_head=2, vocab_size=V, bos_token_id=0, eos_token_id=None,
            pad_token_id=0)).eval())

    return {"gpt2": (gpt2(2, 0), gpt2(1, 3)),
            "folnet": (_folnet(tmp_path_factory, "decoder", "jmc.atp", 1),
                       _folnet(tmp_path_factory, "decoder", "j.a", 3, L=1))}


@pytest.fixture(scope="module")
def seq2seq(tmp_path_factory):
    def t5(num_layers, seed):
        torch.manual_seed(seed)
        model = transformers.T5ForConditionalGeneration(transformers.T5Config(
            d_model=32, d_ff=64, num_layers=num_layers, num_heads=2, vocab_size=V,
            decoder_start_token_id=0, initializer_factor=3.0)).eval()
        model.generation_config.eos_token_id = None  # random weights: no early stop
        return model

    return {"t5": (t5(2, 1), t5(1, 4)),
            "folnet": (_folnet(tmp_path_factory, "encoder-decoder", "jmc.atp", 3),
                       _folnet(tmp_path_factory, "encoder-decoder", "j.a", 4, L=1))}


def _prompt(B=1, T=6, seed=0):
    return torch.randint(5, V, (B, T), generator=torch.Generator().manual_seed(seed))


class _Crops:
    """Counts, on folnet's cache, the crops that dropped tokens (rejected candidates)."""

    def __init__(self, monkeypatch):
        self.dropped = []
        original = FolnetCache.crop

        def spy(cache, max_length):
            before = cache.get_seq_length()
            original(cache, max_length)
            if cache.get_seq_length() < before:
                self.dropped.append(before - cache.get_seq_length())

        monkeypatch.setattr(FolnetCache, "crop", spy)


@pytest.mark.parametrize("assistant", ["smaller", "itself"])
@pytest.mark.parametrize("kind", ["causal", "seq2seq"])
def test_assisted_greedy_gives_greedys_tokens(causal, seq2seq, kind, assistant, monkeypatch):
    crops = _Crops(monkeypatch)
    for name, (model, smaller) in (causal if kind == "causal" else seq2seq).items():
        helper = smaller if assistant == "smaller" else model
        ids = _prompt()
        want = model.generate(ids, max_new_tokens=NEW, pad_token_id=0)
        assert len(set(want[0, -NEW:].tolist())) > 3, name  # not one token repeated
        got = model.generate(ids, max_new_tokens=NEW, pad_token_id=0, assistant_model=helper)
        assert torch.equal(got, want), name
    if assistant == "smaller":  # candidates were rejected and folnet's caches cropped
        assert len(crops.dropped) >= 2, crops.dropped
    else:  # the model agrees with itself: every candidate accepted, nothing to drop
        assert crops.dropped == []


@pytest.mark.parametrize("kind", ["causal", "seq2seq"])
def test_each_row_of_a_left_padded_batch_assisted_gives_the_batchs_greedy(causal, seq2seq,
                                                                          kind):
    """transformers assists one row at a time (batch size 1, for GPT-2 and T5 too): every row
    of a left-padded batch, assisted alone with its padding, gives the batch's greedy row."""
    ids = _prompt(B=2, T=7, seed=1)
    mask = torch.ones_like(ids)
    ids[1, :3], mask[1, :3] = 0, 0  # row 1 left-padded by three
    for name, (model, smaller) in (causal if kind == "causal" else seq2seq).items():
        want = model.generate(ids, attention_mask=mask, max_new_tokens=NEW, pad_token_id=0)
        with pytest.raises(ValueError, match="batch_size = 1"):
            model.generate(ids, attention_mask=mask, max_new_tokens=NEW, pad_token_id=0,
                           assistant_model=smaller)
        for row in range(2):
            got = model.generate(ids[row : row + 1], attention_mask=mask[row : row + 1],
                                 max_new_tokens=NEW, pad_token_id=0, assistant_model=smaller)
            assert torch.equal(got[0], want[row]), (name, row)


@pytest.mark.parametrize("kind", ["causal", "seq2seq"])
def test_prompt_lookup_gives_greedys_tokens(causal, seq2seq, kind):
    phrase = _prompt(T=5, seed=2)
    ids = phrase.repeat(1, 3)  # a repetitive prompt: its n-grams propose candidates
    for name, (model, _) in (causal if kind == "causal" else seq2seq).items():
        want = model.generate(ids, max_new_tokens=NEW, pad_token_id=0)
        calls: list[int] = []
        hook = model.register_forward_pre_hook(lambda *_, seen=calls: seen.append(1))
        got = model.generate(ids, max_new_tokens=NEW, pad_token_id=0,
                             prompt_lookup_num_tokens=3)
        hook.remove()
        assert torch.equal(got, want), name
        if name == "folnet":  # candidates accepted: fewer forward calls than new tokens
            assert len(calls) < NEW, len(calls)


def test_a_prefix_lms_prompt_survives_the_assistants_crops(causal):
    """The assistant crops its cache to two tokens before the end, into the prompt when the
    model accepted no candidate; a PrefixLM's prompt is kept (its rows see each other both
    ways) and transformers feeds only what the cache does not hold."""
    model, smaller = causal["folnet"]
    ids = _prompt(seed=3)
    want = model.generate(ids, max_new_tokens=NEW, prefix_lengths=6)
    got = model.generate(ids, max_new_tokens=NEW, prefix_lengths=6, assistant_model=smaller)
    assert torch.equal(got, want)


def _native(kind, seed=5):
    torch.manual_seed(seed)
    return folnet.build_model("jmc.atp", kind=kind, preset="tiny", vocab_size=V,
                              dropout=0.0).eval()


def test_crop_takes_transformers_forms():
    model = _native("decoder")
    with torch.no_grad():
        _, session = model.begin(_prompt(T=4))
        cache = FolnetCache(session)
        session.step(_prompt(T=6, seed=1))
    assert cache.get_seq_length() == 10
    cache.crop(0)  # drops nothing (transformers' crop(-0) after every candidate matched)
    cache.crop(torch.tensor(-1))  # transformers 5.17 passes a 0-d tensor
    cache.crop(-2)
    assert cache.get_seq_length() == 7
    cache.crop(8)  # the older form: keep the first 8 (there are only 7)
    cache.crop(5)
    assert cache.get_seq_length() == 5
    with pytest.raises(folnet.FolnetError, match="crop\\(-6\\): the cache holds only 5"):
        cache.crop(-6)
    with pytest.raises(folnet.FolnetError, match="crop takes an integer number of tokens"):
        cache.crop(1.5)


@pytest.mark.numerics
def test_a_crop_into_a_prefix_lms_prompt_keeps_the_prompt():
    """The cache says how much it kept, and transformers feeds the rest
    (test_a_prefix_lms_prompt_survives_the_assistants_crops)."""
    model, ids, new = _native("decoder"), _prompt(T=4), _prompt(T=3, seed=1)
    with torch.no_grad():
        _, prefixed = model.begin(ids, prefix=torch.tensor([4]))
        cache = FolnetCache(prefixed)
        prefixed.step(new)
        cache.crop(-5)  # into the prompt: the prompt is kept, get_seq_length says so
        assert cache.get_seq_length() == 4
        got = prefixed.step(new[:, :1])
        full = model(torch.cat([ids, new[:, :1]], 1), prefix_lengths=4).logits[:, -1:]
    assert_close(got, full, rtol=0, atol=1e-5, what="PrefixLM session after a crop")
