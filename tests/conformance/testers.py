"""Model testers in the shape of transformers' own (``BertModelTester``): a small config, random
inputs, and ``prepare_config_and_inputs_for_common`` -- one for BERT and GPT-2 (the controls)
and one for folnet's three kinds. Copied by `tests/conformance/run.py` beside transformers'
``test_modeling_common.py`` from the pinned source distribution; not collected by ``make test``.
"""

from __future__ import annotations

import torch
from transformers.testing_utils import torch_device

from ..test_modeling_common import ids_tensor, random_attention_mask


class SmallTester:
    """The sizes every tester here shares (those of transformers' BERT tester)."""

    def __init__(self, parent, batch_size=13, seq_length=7, vocab_size=99, hidden_size=32,
                 num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
                 max_position_embeddings=512, type_vocab_size=16, num_labels=3,
                 num_choices=4, is_training=True, use_token_type_ids=True):
        self.parent = parent
        self.batch_size, self.seq_length = batch_size, seq_length
        self.vocab_size, self.hidden_size = vocab_size, hidden_size
        self.num_hidden_layers, self.num_attention_heads = num_hidden_layers, num_attention_heads
        self.intermediate_size = intermediate_size
        self.max_position_embeddings = max_position_embeddings
        self.type_vocab_size = type_vocab_size
        self.num_labels, self.num_choices = num_labels, num_choices
        self.is_training, self.use_token_type_ids = is_training, use_token_type_ids
        self.pad_token_id = 0

    def inputs(self) -> dict[str, torch.Tensor]:
        shape = [self.batch_size, self.seq_length]
        ids = ids_tensor(shape, self.vocab_size)
        mask = random_attention_mask(shape)
        out = {"input_ids": ids, "attention_mask": mask}
        if self.use_token_type_ids:
            out["token_type_ids"] = ids_tensor(shape, self.type_vocab_size)
        return {k: v.to(torch_device) for k, v in out.items()}

    def prepare_config_and_inputs_for_common(self):
        return self.get_config(), self.inputs()


class BertTester(SmallTester):
    def get_config(self):
        from transformers import BertConfig

        return BertConfig(vocab_size=self.vocab_size, hidden_size=self.hidden_size,
                          num_hidden_layers=self.num_hidden_layers,
                          num_attention_heads=self.num_attention_heads,
                          intermediate_size=self.intermediate_size, hidden_act="gelu",
                          hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1,
                          max_position_embeddings=self.max_position_embeddings,
                          type_vocab_size=self.type_vocab_size, initializer_range=0.02,
                          is_decoder=False)


class Gpt2Tester(SmallTester):
    def __init__(self, parent, **kwargs):
        super().__init__(parent, use_token_type_ids=False, **kwargs)

    def get_config(self):
        from transformers import GPT2Config

        return GPT2Config(vocab_size=self.vocab_size, n_embd=self.hidden_size,
                          n_layer=self.num_hidden_layers, n_head=self.num_attention_heads,
                          n_inner=self.intermediate_size, n_positions=self.max_position_embeddings,
                          resid_pdrop=0.1, embd_pdrop=0.1, attn_pdrop=0.1,
                          initializer_range=0.02, pad_token_id=self.vocab_size - 1,
                          bos_token_id=self.vocab_size - 1, eos_token_id=self.vocab_size - 1)


class FolnetTester(SmallTester):
    """folnet at the BERT tester's sizes: D2 8 and the default operators (``jmc.atp``)."""

    def __init__(self, parent, kind="encoder", ops="jmc.atp", **kwargs):
        kwargs.setdefault("use_token_type_ids", kind == "encoder")
        super().__init__(parent, **kwargs)
        self.kind, self.ops = kind, ops

    def get_config(self):
        from folnet.hf import FolnetConfig

        return FolnetConfig(ops=self.ops, preset="tiny", kind=self.kind, D1=self.hidden_size,
                            D2=8, L=self.num_hidden_layers, H=self.num_attention_heads,
                            F1=self.intermediate_size, vocab_size=self.vocab_size,
                            max_positions=self.max_position_embeddings,
                            type_vocab_size=self.type_vocab_size)

    def inputs(self):
        out = super().inputs()
        if self.kind == "encoder-decoder":
            shape = [self.batch_size, self.seq_length]
            out["decoder_input_ids"] = ids_tensor(shape, self.vocab_size).to(torch_device)
        return out
