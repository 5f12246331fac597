"""Generation: the incremental cache reproduces full recomputation (tokens exactly, logits within
1e-5) for both kinds, greedy and sampled; eos; argument checks; seq2seq objectives.

Cached and recomputed logits are two computations (rows against squares): they agree to
rounding, so the same tokens are a claim only where rounding cannot reorder the logits. Greedy
tokens are checked to lead their runner-up by 10x the logits' bound (`assert_tokens_lead`); a
sampled token flips only if the seeded uniform draw lands within ~1e-5 of a boundary of the
cumulative distribution (odds ~1e-4 for a whole test)."""

from __future__ import annotations

import batches
import pytest
import torch
from models import tiny_model
from tolerances import assert_close, assert_tokens_lead

import folnet
from folnet.arch.layer import DualStreamLayer

pytestmark = pytest.mark.usefixtures("one_thread")

V = 60


def tiny(kind, ops="jmc.atp", **kw):
    kw.setdefault("vocab_size", V)
    return tiny_model(ops, kind, seed=1, eval_mode=True, **kw)


def prompt(B=2, n=5, seed=0):
    return torch.randint(0, V, (B, n), generator=torch.Generator().manual_seed(seed))


def both(model, x, new=10, **kw):
    """Cached and recomputed generation with the same arguments (and the same seed)."""
    runs = []
    for use_cache in (True, False):
        gen = torch.Generator().manual_seed(7) if kw.get("do_sample") else None
        runs.append(model.generate(x, new, generator=gen, use_cache=use_cache,
                                   return_logits=True, **kw))
    return runs


SETTINGS = [
    {},
    {"do_sample": True, "temperature": 0.7, "top_k": 8},
    {"do_sample": True, "temperature": 1.5},
]


@pytest.mark.numerics
@pytest.mark.parametrize("kind", ["decoder", "encoder-decoder"])
@pytest.mark.parametrize("setting", SETTINGS, ids=["greedy", "top-k", "hot"])
def test_cache_matches_recomputation(kind, setting):
    model, x = tiny(kind), prompt()
    cached, full = both(model, x, **setting)
    start = x.shape[1] if kind == "decoder" else 1
    assert cached.sequences.shape == (2, start + 10) and cached.logits.shape == (2, 10, V)
    if not setting:
        assert_tokens_lead(cached.logits, full.sequences[:, start:], f"greedy {kind}")
    assert torch.equal(cached.sequences, full.sequences)
    assert_close(cached.logits, full.logits, rtol=0, atol=1e-5, what=f"{kind} cached logits")
    if kind == "decoder":
        assert torch.equal(cached.sequences[:, :start], x)
        # the logits are the model's own next-token logits
        with torch.no_grad():
            ref = model(cached.sequences[:, :-1]).logits[:, start - 1 :]
        assert_close(cached.logits, ref, rtol=0, atol=1e-5, what="cached against a forward")


@pytest.mark.numerics
def test_cache_matches_with_prefix_padding_and_masks():
    model, x = tiny("decoder"), prompt(n=6)
    mask = torch.ones_like(x)
    mask[1, :2] = 0  # row 1 is left-padded
    cached, full = both(model, x, new=8, prefix_lengths=torch.tensor([4, 2]),
                        attention_mask=mask)
    assert_tokens_lead(cached.logits, full.sequences[:, 6:], "prefix decoder")
    assert torch.equal(cached.sequences, full.sequences)
    assert_close(cached.logits, full.logits, rtol=0, atol=1e-5, what="prefix decoder logits")
    ed = tiny("encoder-decoder")
    cached, full = both(ed, x, new=8, attention_mask=mask, decoder_start_token_id=3)
    assert_tokens_lead(cached.logits, full.sequences[:, 1:], "padded encoder-decoder")
    assert torch.equal(cached.sequences, full.sequences) and bool((cached.sequences[:, 0] == 3)
                                                                  .all())
    assert_close(cached.logits, full.logits, rtol=0, atol=1e-5,
                 what="padded encoder-decoder logits")


@pytest.mark.parametrize("kind", ["decoder", "encoder-decoder"])
def test_cached_steps_compute_one_row(kind, monkeypatch):
    """With the cache, each new token runs every layer on one row; without, on all of them."""
    seen = []
    original = DualStreamLayer.forward

    def spy(self, u1, u2, domain, **kw):
        if domain.rows is not None:  # query rows of a longer domain
            seen.append((u1.shape[1], u2.shape[1]))
        return original(self, u1, u2, domain, **kw)

    monkeypatch.setattr(DualStreamLayer, "forward", spy)
    model, x = tiny(kind, "j.at"), prompt()
    model.generate(x, 6)
    L = model.cfg.L
    assert len(seen) == (6 if kind == "encoder-decoder" else 5) * L
    assert set(seen) == {(1, 1)}


@pytest.mark.numerics
@pytest.mark.parametrize("kind", ["decoder", "encoder-decoder"])
def test_a_cropped_session_continues_as_recomputation(kind):
    """Candidates fed several at once (what assisted decoding verifies), the session cropped
    past the rejected ones, then other tokens: the logits are a full forward's over the kept
    sequence (rows against a square: rounding apart) and a fresh session's that never saw the
    dropped tokens."""
    model = tiny(kind)
    ids, candidates, other = prompt(), prompt(n=4, seed=1), prompt(n=3, seed=2)
    pad = torch.ones_like(ids, dtype=torch.bool)
    pad[1, :2] = False  # row 1 left-padded
    start = torch.zeros(2, 1, dtype=torch.long)  # the encoder-decoder's first decoder token
    begin = ((lambda: model.begin(ids, pad)) if kind == "decoder" else
             (lambda: model.begin(ids, pad, start)))
    with torch.no_grad():
        _, session = begin()  # room for 10 or 6 positions: the candidates make it grow
        kept = session.length + 1
        session.step(candidates)  # (2, 4) at once
        session.crop(kept)  # the first candidate accepted, three rejected
        got = session.step(other)  # (2, 3, V)
        _, fresh = begin()
        fresh.step(candidates[:, :1])
        want = fresh.step(other)
        if kind == "decoder":
            seq = torch.cat([ids, candidates[:, :1], other], 1)
            mask = torch.cat([pad, torch.ones(2, 4, dtype=torch.bool)], 1)
            full = model(seq, attention_mask=mask).logits[:, -3:]
        else:
            dec = torch.cat([start, candidates[:, :1], other], 1)
            full = model(ids, dec, attention_mask=pad).logits[:, -3:]
    assert session.length == fresh.length == kept + 3
    assert_close(got, want, rtol=0, atol=1e-5, what=f"cropped {kind} session against a fresh one")
    assert_close(got, full, rtol=0, atol=1e-5, what=f"cropped {kind} session against a forward")


def test_crop_keeps_what_a_step_cannot_recompute():
    """A crop may not drop an encoder-decoder's inputs (not tokens) nor a PrefixLM's prefix,
    each counted from its row's first real token (its rows see each other both ways)."""
    ed = tiny("encoder-decoder", "j.a")
    with torch.no_grad():
        _, session = ed.begin(prompt(), None, torch.zeros(2, 1, dtype=torch.long))
    session.crop(5)  # the inputs alone: the decoder start token fed again next
    assert session.length == 5
    with pytest.raises(folnet.FolnetError, match=r"crop: length must be an integer >= 5 \(the "
                                                 r"positions a step cannot recompute"):
        session.crop(4)
    model = tiny("decoder", "j.a")
    pad = torch.ones(2, 5, dtype=torch.bool)
    pad[1, :2] = False
    with torch.no_grad():
        _, session = model.begin(prompt(), pad, torch.tensor([3, 2]))
        session.step(prompt(n=2))
    with pytest.raises(folnet.FolnetError, match=r"integer >= 4 .* got 3"):
        session.crop(3)  # row 1's prefix: 2 pads + 2 tokens
    with pytest.raises(folnet.FolnetError, match=r"got 4.5"):
        session.crop(4.5)
    session.crop(4)
    assert session.length == 4


def test_eos_stops_and_pads():
    model, x = tiny("decoder"), prompt(B=1)
    free = model.generate(x, 8)
    eos = int(free[0, x.shape[1] + 2])
    out = model.generate(x, 8, eos_token_id=eos, pad_token_id=0)
    first = (out[0, x.shape[1] :] == eos).nonzero()[0, 0]
    assert out.shape[1] == x.shape[1] + int(first) + 1  # every row done: stopped early
    assert torch.equal(out, free[:, : out.shape[1]])


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"max_new_tokens": 508}, r"max_new_tokens = 508 with 5 prompt tokens makes 513 positions,"
                                  r" beyond the position limit max_positions = 512"),
        ({"max_new_tokens": 0}, r"max_new_tokens must be a positive integer"),
        ({"max_new_tokens": 2, "temperature": 0.0}, r"temperature must be a finite number > 0"),
        ({"max_new_tokens": 2, "temperature": float("nan")}, r"temperature must be a finite"),
        ({"max_new_tokens": 2, "top_k": 0}, r"top_k must be None or an integer >= 1"),
        ({"max_new_tokens": 2, "do_sample": "yes"}, r"do_sample must be True or False"),
        ({"max_new_tokens": 2, "eos_token_id": V}, rf"eos_token_id must be None or an id in "
                                                   rf"\[0, vocab_size = {V}\)"),
        ({"max_new_tokens": 2, "prefix_lengths": 6}, r"prefix_lengths\[0\] = 6 is longer than "
                                                     r"the sequence \(5 tokens\)"),
    ],
)
def test_bad_generation_arguments(kw, match):
    with pytest.raises(folnet.FolnetError, match=match):
        tiny("decoder", "j.a").generate(prompt(), **kw)


def test_bad_encoder_decoder_generation_arguments():
    model = tiny("encoder-decoder", "j.a", max_positions=16)
    with pytest.raises(ValueError, match=r"max_new_tokens = 16 with 1 decoder start token makes "
                                         r"17 positions, beyond .* max_positions = 16"):
        model.generate(prompt(), 16)
    with pytest.raises(folnet.FolnetError, match=r"decoder_start_token_id must be an id"):
        model.generate(prompt(), 2, decoder_start_token_id=-1)
    with pytest.raises(folnet.FolnetError, match=r"input_ids contain id 99, outside"):
        model.generate(torch.full((1, 3), 99), 2)


def test_objectives_build_consistent_batches():
    seqs = [list(range(10, 30)), list(range(30, 42))]  # below the sentinel ids
    g = torch.Generator().manual_seed(0)
    sentinels = list(range(V - 1, V - 11, -1))
    batch = batches.span_corruption_batch(seqs, sentinels, generator=g, noise_density=0.3)
    for i, seq in enumerate(seqs):  # input spans + target spans rebuild the sequence
        src = batch.input_ids[i][batch.attention_mask[i] == 1].tolist()
        tgt = batch.labels[i][batch.labels[i] != -100].tolist()
        spans, cur = {}, None
        for t in tgt:
            if t in sentinels:
                cur = spans.setdefault(t, [])
            else:
                cur.append(t)
        rebuilt = [t for s in src for t in (spans[s] if s in sentinels else [s])]
        assert rebuilt == seq and 0 < sum(map(len, spans.values())) < len(seq)
        assert batch.decoder_input_ids[i, 0] == 0
        assert torch.equal(batch.decoder_input_ids[i, 1:], batch.labels[i, :-1].clamp(min=0))
    pre = batches.prefix_lm_batch(seqs, generator=g)
    for i, seq in enumerate(seqs):
        src = pre.input_ids[i][pre.attention_mask[i] == 1].tolist()
        assert src + pre.labels[i][pre.labels[i] != -100].tolist() == seq
    lm = batches.lm_batch(seqs, prefix_lm=True, generator=g)
    assert lm.labels[1, -1] == -100 and bool((lm.prefix_lengths >= 1).all())
    with pytest.raises(folnet.FolnetError, match=r"sequences\[0\] has 1 tokens"):
        batches.prefix_lm_batch([[5]])


def test_seq2seq_objective_trains():
    model = tiny("encoder-decoder", "jmc.atp")
    model.train()
    seqs = [torch.randint(0, V - 10, (16,), generator=torch.Generator().manual_seed(i))
            for i in range(2)]
    batch = batches.span_corruption_batch(seqs, list(range(V - 1, V - 11, -1)),
                                             generator=torch.Generator().manual_seed(0))
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(6):
        out = model(batch.input_ids, batch.decoder_input_ids, labels=batch.labels,
                    attention_mask=batch.attention_mask,
                    decoder_attention_mask=batch.decoder_attention_mask)
        opt.zero_grad()
        out.loss.backward()
        opt.step()
        losses.append(out.loss.item())
    assert losses[-1] < losses[0]
    # labels alone derive the decoder inputs by shifting right
    again = model.eval()(batch.input_ids, labels=batch.labels,
                         attention_mask=batch.attention_mask)
    assert again.logits.shape == (2, batch.labels.shape[1], V)
