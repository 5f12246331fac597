"""`trim_padding`: the columns both training loops cut off a batch (the pretraining loop's
equality with the untrimmed run is in tests/train/test_pretrain.py)."""

from __future__ import annotations

import torch

from folnet.train.data.padding import trim_padding


def _batch(mask_rows: list[list[int]]) -> dict[str, torch.Tensor]:
    mask = torch.tensor(mask_rows, dtype=torch.bool)  # [B, T]
    generator = torch.Generator().manual_seed(3)
    ids = torch.randint(5, 90, mask.shape, generator=generator)
    return {"input_ids": ids, "token_type_ids": (ids % 2), "attention_mask": mask,
            "mlm_labels": torch.where(mask, ids, torch.full_like(ids, -100)),
            "nsp_labels": torch.tensor([1, 0, 1])}


def test_right_padding_is_cut_after_the_longest_row_and_row_tensors_pass():
    batch = _batch([[1, 1, 1, 0, 0, 0, 0], [1, 1, 1, 1, 1, 0, 0], [1, 1, 0, 0, 0, 0, 0]])
    cut = trim_padding(batch)
    assert {k: tuple(v.shape) for k, v in cut.items()} == {
        "input_ids": (3, 5), "token_type_ids": (3, 5), "attention_mask": (3, 5),
        "mlm_labels": (3, 5), "nsp_labels": (3,)}
    for key in ("input_ids", "token_type_ids", "attention_mask", "mlm_labels"):
        assert torch.equal(cut[key], batch[key][:, :5]), key
        assert not batch[key][:, 5:][batch["attention_mask"][:, 5:]].numel()  # only pads cut
    assert torch.equal(cut["nsp_labels"], batch["nsp_labels"])


def test_left_padding_keeps_every_real_token():
    """A cut by the longest row's length (what finetuning's trim did) would drop the last
    columns of a left-padded batch, which hold every row's real tokens."""
    batch = _batch([[0, 0, 0, 1, 1, 1], [0, 1, 1, 1, 1, 1], [0, 0, 0, 0, 1, 1]])
    cut = trim_padding(batch)
    assert cut["input_ids"].shape == (3, 6)
    assert torch.equal(cut["input_ids"], batch["input_ids"])


def test_per_choice_masks_and_a_batch_without_padding_or_mask():
    mask = torch.zeros(2, 3, 8, dtype=torch.bool)  # [B, choices, T]
    mask[0, 1, :6] = True
    mask[1, 2, :4] = True
    ids = torch.arange(48).reshape(2, 3, 8)
    cut = trim_padding({"input_ids": ids, "attention_mask": mask, "labels": torch.tensor([1, 2])})
    assert cut["input_ids"].shape == (2, 3, 6) and torch.equal(cut["input_ids"], ids[..., :6])
    assert cut["labels"].shape == (2,)
    full = _batch([[1] * 4, [1] * 4, [1] * 4])
    assert all(torch.equal(trim_padding(full)[k], v) for k, v in full.items())
    no_mask = {"input_ids": ids}
    assert trim_padding(no_mask)["input_ids"] is ids


def test_a_batch_without_a_real_token_keeps_one_column():
    batch = _batch([[0, 0, 0], [0, 0, 0], [0, 0, 0]])
    assert trim_padding(batch)["input_ids"].shape == (3, 1)
