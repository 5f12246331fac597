"""An operator of your own, from its TOML declaration to a trained, saved and reloaded model.

The operator is ``q`` (bprod, ``B <- B x U``): the relation of x and y in head h is a sum over
channels w of the pair's kernel K_w(x, y) times x's unary premise v_hw(x). The model ``j.aq``
uses it beside attention (``j``, ``a``); a plain PyTorch loop fits it to one batch of a toy
relational task (does token 7 come after token 9?), then it is saved and loaded again in a
process where ``q`` is not registered.

    python examples/custom_operator.py
    python examples/custom_operator.py --steps 100
"""

from __future__ import annotations

import argparse
import tempfile

import torch

import folnet

BPROD = """
[[operator]]
symbol = "q"
name = "bprod"
typing = "B <- B x U"
kernel = "x y w"
premise = "x h w"
output = "x y h"
bdim = "x"
rdim = "w"
"""


def batch(size: int, length: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Sequences of tokens 10..19 holding 9 and 7 once each, after a [CLS] (id 2); the label
    says whether the 7 comes after the 9."""
    ids = torch.randint(10, 20, (size, length), generator=generator)
    for row in range(size):
        i, j = torch.randperm(length - 1, generator=generator)[:2] + 1
        ids[row, i], ids[row, j] = 9, 7
    ids[:, 0] = 2
    labels = ((ids == 7).float().argmax(1) > (ids == 9).float().argmax(1)).long()
    return ids, labels


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30, help="training steps (default 30)")
    args = parser.parse_args()
    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(0)

    spec = folnet.register_operator(BPROD)  # the same table works in an --operators FILE
    print(f"registered {spec.symbol} ({spec.name}, {spec.typing}): {spec.formula}")

    model = folnet.build_model("j.aq", preset="tiny", vocab_size=32, head="classification",
                               num_labels=2, dropout=0.0, initializer_range=0.15)
    ids, labels = batch(16, 12, generator)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for step in range(1, args.steps + 1):
        loss = model(ids, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        if step == 1 or step % 10 == 0:
            print(f"step {step:4d}  loss {loss.item():.3f}")
    assert losses[-1] < losses[0], "the loss did not fall"

    # The saved config.json carries q's spec, so the model loads where q is not registered.
    model.eval()
    with tempfile.TemporaryDirectory() as folder:
        model.save_pretrained(folder)
        folnet.unregister_operator("q")
        loaded = folnet.from_pretrained(folder).eval()
        with torch.no_grad():
            assert torch.equal(loaded(ids).logits, model(ids).logits)
        print(f"reloaded {loaded.plan} without registering q: the same logits")


if __name__ == "__main__":
    main()
