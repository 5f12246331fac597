"""The encoder FOLNet (the paper's model, and the released checkpoints') with its heads.

``FolnetModel(cfg, head=...)`` is what `folnet.build_model` returns for ``kind="encoder"``;
``model(input_ids, ...)`` gives a `FolnetOutput`. Inputs are checked before any computation.
"""

from __future__ import annotations

import torch
import torch.utils._pytree as pytree

from folnet.arch.config import ModelConfig
from folnet.arch.head_table import Targets
from folnet.arch.inputs import check_ids, check_mask, check_token_types, values_checked
from folnet.arch.kinds import register_kind
from folnet.arch.layer.atoms import relative_position_ids, token_positions
from folnet.arch.layer.domain import Domain
from folnet.arch.layer.stack import Record, Stack
from folnet.arch.models.base import FolnetBase
from folnet.arch.outputs import FolnetOutput, recorded
from folnet.arch.plan import ArchPlan
from folnet.errors import FolnetError


@register_kind("encoder")
class FolnetModel(FolnetBase):
    """A bidirectional FOLNet encoder (stack + pooler) with an optional head."""

    def __init__(self, cfg: ModelConfig, head: str | None = None, num_labels: int = 2, *,
                 plan: ArchPlan | None = None):
        super().__init__(cfg, head, num_labels, plan=plan)
        self.encoder = Stack(cfg, self.plan)
        self.add_head(self.encoder.atoms.embedding)
        # training sets it: MLM logits only at the predicted positions (True), or at P
        # positions per sequence, the predicted ones first (an int: static shapes, no sync;
        # `folnet.arch.heads.gather_masked`)
        self.gather_mlm: bool | int = False
        # whether forward computes relation_output (the final binary stream) when the call
        # does not say (``output_relations``): no built-in head reads it, so by default the
        # last layer skips its binary-stream updates
        self.relations = False
        self.reset_parameters()

    def word_embedding(self):
        return self.encoder.atoms.embedding

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None, *,
                labels: torch.Tensor | None = None, mlm_labels: torch.Tensor | None = None,
                nsp_labels: torch.Tensor | None = None,
                start_positions: torch.Tensor | None = None,
                end_positions: torch.Tensor | None = None, output_relations: bool | None = None,
                output_hidden_states: bool = False, output_attentions: bool = False
                ) -> FolnetOutput:
        """input_ids (B, T) [(B, C, T) for multiple choice] -> `FolnetOutput`.
        ``attention_mask`` (B, T) removes pad tokens from every reduction over tokens; without
        it the outputs are the released code's. ``output_relations`` computes the final binary
        stream (``relation_output``; default: the model's ``relations``);
        ``output_hidden_states`` and ``output_attentions`` return the per-layer states and the
        softmax operators' activated kernels (`folnet.arch.layer.stack.Record`)."""
        choices = self.head_spec is not None and self.head_spec.multiple_choice
        shape = None
        if choices:
            if not isinstance(input_ids, torch.Tensor) or input_ids.ndim != 3:
                raise FolnetError("multiple-choice input_ids must have shape (batch, choices, "
                                  f"tokens), got {tuple(getattr(input_ids, 'shape', ()))}")
            if 0 in input_ids.shape:  # named before flattening hides which size is 0
                raise FolnetError(f"input_ids is empty (shape {tuple(input_ids.shape)}); give "
                                  f"at least one row of at least one choice of one token")
            shape = input_ids.shape[:2]
            input_ids, token_type_ids, attention_mask = (
                None if t is None else t.flatten(0, 1)
                for t in (input_ids, token_type_ids, attention_mask))
        values = isinstance(input_ids, torch.Tensor) and values_checked(input_ids, self.validate)
        ids = check_ids(self.cfg, input_ids, values=values)
        types = check_token_types(self.cfg, token_type_ids, ids, values=values)
        pad = check_mask(attention_mask, ids, values=values)
        T = ids.shape[1]
        positions = token_positions(pad, T, ids.device)  # (B|1, T)
        rel = (relative_position_ids(types, self.cfg.delta, None if pad is None else positions)
               if self.cfg.relative_ids else None)  # (B, T, T)
        domain = Domain(n=T, pad=pad, rel_ids=rel if self.cfg.position == "rpe*" else None)
        relations = self.relations if output_relations is None else bool(output_relations)
        record = Record.asked(output_hidden_states, relations, output_attentions)
        seq, rel_out = self.encoder(ids, types, domain, positions, rel, relations=relations,
                                    record=record)
        pooled = self.encoder.pool(seq)
        extra = recorded(record)
        if shape is not None:  # (B*C, ...) -> (B, C, ...)
            seq, pooled, rel_out = (None if t is None else t.unflatten(0, shape)
                                    for t in (seq, pooled, rel_out))
            extra = pytree.tree_map(lambda t: t.unflatten(0, shape), extra)
        out = FolnetOutput(sequence_output=seq, pooled_output=pooled, relation_output=rel_out,
                           **extra)
        if self.head_spec is not None:
            losses = self.head_spec.forward(self, out, Targets(
                labels=labels, mlm_labels=mlm_labels, nsp_labels=nsp_labels,
                start_positions=start_positions, end_positions=end_positions,
                gather_mlm=self.gather_mlm, values=values))
            if losses:
                out.loss = torch.stack(losses).sum()
        return out
