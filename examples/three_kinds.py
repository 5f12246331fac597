"""One operator string, three kinds of model: an encoder (BERT-like), a decoder (GPT-like)
and an encoder-decoder (T5-like), each run, saved and loaded again.

    python examples/three_kinds.py
    python examples/three_kinds.py --ops j.at --preset small
"""

from __future__ import annotations

import argparse
import tempfile

import torch

import folnet


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", default="jmc.atp", help="operator string (default jmc.atp)")
    parser.add_argument("--preset", default="tiny", help="tiny, small, base or large")
    args = parser.parse_args()
    torch.manual_seed(0)
    vocab = 1000
    ids = torch.randint(5, vocab, (2, 24))  # (B, T)

    # an encoder with a classification head
    encoder = folnet.build_model(args.ops, preset=args.preset, vocab_size=vocab,
                                 head="classification", num_labels=3)
    out = encoder(ids, attention_mask=torch.ones_like(ids), labels=torch.tensor([0, 2]),
                  output_relations=True)
    print(f"encoder:          logits {tuple(out.logits.shape)}, binary stream "
          f"{tuple(out.relation_output.shape)}, loss {out.loss.item():.3f}")

    # a decoder: next-token loss, then sampling with the row cache
    decoder = folnet.build_model(args.ops, kind="decoder", preset=args.preset, vocab_size=vocab)
    loss = decoder(ids, labels=ids).loss
    new = decoder.eval().generate(ids[:, :8], max_new_tokens=8, do_sample=True, top_k=20)
    print(f"decoder:          loss {loss.item():.3f}, generated {tuple(new.shape)}")

    # an encoder-decoder: the decoder reads the encoded source
    seq2seq = folnet.build_model(args.ops, kind="encoder-decoder", preset=args.preset,
                                 vocab_size=vocab)
    targets = torch.randint(5, vocab, (2, 10))
    loss = seq2seq(ids, decoder_input_ids=targets, labels=targets).loss
    print(f"encoder-decoder:  loss {loss.item():.3f}")

    # every model saves to a directory that carries all it needs to load again
    for name, model in (("encoder", encoder), ("decoder", decoder),
                        ("encoder-decoder", seq2seq)):
        with tempfile.TemporaryDirectory() as folder:
            model.save_pretrained(folder)
            again = folnet.from_pretrained(folder).eval()
            model.eval()
            a = model(ids) if name != "encoder-decoder" else model(ids, decoder_input_ids=targets)
            b = again(ids) if name != "encoder-decoder" else again(ids, decoder_input_ids=targets)
            assert torch.equal(a[0], b[0]), name  # bit for bit
            print(f"{name:17s} saved and loaded: {again.plan}, the same outputs")


if __name__ == "__main__":
    main()
