"""The FOLNet encoder stack and the model with its heads.

``FolnetModel(cfg, head=...)`` is what `folnet.build_model` returns; ``model(input_ids, ...)``
gives a `FolnetOutput`. Inputs are checked before any computation and every fault is a
`FolnetError` naming the argument and the limit.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from folnet.arch.config import ModelConfig
from folnet.arch.embeddings import BaseAtoms, relative_position_ids
from folnet.arch.heads import HEADS, MLMHead, PoolerClassifier, gather_masked, mlm_loss
from folnet.arch.layer import FolnetLayer
from folnet.arch.plan import ArchPlan, parse_plan
from folnet.errors import FolnetError, choices


@dataclass
class FolnetOutput:
    """What a forward pass returns; fields a head does not produce stay None."""

    sequence_output: torch.Tensor  # (B, T, D1) final unary atoms
    pooled_output: torch.Tensor  # (B, D1) tanh(Linear) of token 0
    relation_output: torch.Tensor | None  # (B, T, T, D2) final binary atoms; None when
    # the model's ``relations`` is off
    loss: torch.Tensor | None = None
    mlm_logits: torch.Tensor | None = None  # (B, T, V) or (N, V) when only masked positions
    nsp_logits: torch.Tensor | None = None  # (B, 2)
    logits: torch.Tensor | None = None  # task head
    start_logits: torch.Tensor | None = None  # qa
    end_logits: torch.Tensor | None = None  # qa
    mlm_labels: torch.Tensor | None = None  # the labels matching mlm_logits rows when gathered


class FolnetEncoder(nn.Module):
    """Base atoms -> L dual-branch layers -> final LayerNorm on both streams -> pooler."""

    def __init__(self, cfg: ModelConfig, plan: ArchPlan | None = None, *, causal: bool = False):
        super().__init__()
        self.cfg = cfg
        self.plan = plan or parse_plan(cfg.ops, cfg.L)
        self.atoms = BaseAtoms(cfg)
        self.layers = nn.ModuleList(FolnetLayer(lp, cfg, causal=causal) for lp in self.plan.layers)
        self.pooler = nn.Linear(cfg.D1, cfg.D1)
        self.checkpointing = False

    def forward(self, input_ids, token_type_ids, pad=None, relations: bool = True):
        """-> (sequence (B, T, D1), pooled (B, D1), relations (B, T, T, D2) or None). With
        ``relations=False`` the last layer skips its binary-stream updates (nothing would read
        them) and no relations are returned."""
        cfg = self.cfg
        rel_ids = (relative_position_ids(token_type_ids, cfg.delta)
                   if cfg.position in ("rpe", "rpe*") else None)  # (B, T, T)
        u1, u2 = self.atoms(input_ids, token_type_ids, rel_ids)
        last = len(self.layers) - 1
        for i, layer in enumerate(self.layers):
            unary_only = not relations and i == last
            if self.checkpointing and self.training:
                u1, u2 = torch.utils.checkpoint.checkpoint(
                    layer, u1, u2, pad, rel_ids, unary_only=unary_only, use_reentrant=False)
            else:
                u1, u2 = layer(u1, u2, pad, rel_ids, unary_only=unary_only)
        u1 = F.layer_norm(u1, (cfg.D1,), eps=cfg.layer_norm_eps)
        if u2 is not None:
            u2 = F.layer_norm(u2, (cfg.D2,), eps=cfg.layer_norm_eps)
        pooled = torch.tanh(self.pooler(u1[:, 0]))
        return u1, pooled, u2


def check_inputs(cfg: ModelConfig, input_ids, token_type_ids, attention_mask):
    """Validate ids and masks before any computation; returns (token_type_ids, pad mask)."""
    if not isinstance(input_ids, torch.Tensor):
        raise FolnetError(f"input_ids must be a tensor, got {type(input_ids).__name__}")
    if input_ids.is_floating_point() or input_ids.dtype == torch.bool:
        raise FolnetError(f"input_ids must be integer token ids, got dtype {input_ids.dtype}")
    if input_ids.ndim != 2 or input_ids.shape[1] == 0:
        raise FolnetError(f"input_ids must have shape (batch, tokens) with tokens >= 1, got "
                          f"{tuple(input_ids.shape)}")
    lo, hi = int(input_ids.min()), int(input_ids.max())
    if lo < 0:
        raise FolnetError(f"input_ids contain a negative id ({lo}); ids must be in "
                          f"[0, vocab_size = {cfg.vocab_size})")
    if hi >= cfg.vocab_size:
        raise FolnetError(f"input_ids contain id {hi}, outside the vocabulary: ids must be < "
                          f"vocab_size = {cfg.vocab_size}")
    T = input_ids.shape[1]
    if cfg.position == "ape" and T > cfg.max_positions:
        raise FolnetError(f"input_ids have {T} tokens but the absolute-position table has "
                          f"max_positions = {cfg.max_positions} rows (use position='rpe' for "
                          f"any length)")
    if token_type_ids is None:
        token_type_ids = torch.zeros_like(input_ids)
    else:
        if tuple(token_type_ids.shape) != tuple(input_ids.shape):
            raise FolnetError(f"token_type_ids shape {tuple(token_type_ids.shape)} differs from "
                              f"input_ids shape {tuple(input_ids.shape)}")
        if token_type_ids.is_floating_point():
            raise FolnetError(f"token_type_ids must be integers, got {token_type_ids.dtype}")
        tlo, thi = int(token_type_ids.min()), int(token_type_ids.max())
        if tlo < 0 or thi >= cfg.type_vocab_size:
            bad = tlo if tlo < 0 else thi
            raise FolnetError(f"token_type_ids contain {bad}, outside [0, type_vocab_size = "
                              f"{cfg.type_vocab_size})")
    pad = None
    if attention_mask is not None:
        if tuple(attention_mask.shape) != tuple(input_ids.shape):
            raise FolnetError(f"attention_mask shape {tuple(attention_mask.shape)} differs from "
                              f"input_ids shape {tuple(input_ids.shape)}")
        pad = attention_mask.to(torch.bool)
        if not bool(pad.all()):
            if not bool(pad.any(dim=1).all()):
                raise FolnetError("attention_mask has a row with no real token; every sequence "
                                  "needs at least one position set to 1")
        else:
            pad = None  # nothing to mask: take the unmasked (faster, released-identical) path
    return token_type_ids, pad


class FolnetModel(nn.Module):
    """A FOLNet encoder with an optional head (see `HEADS`)."""

    def __init__(self, cfg: ModelConfig, head: str | None = None, num_labels: int = 2):
        super().__init__()
        if head is not None and head not in HEADS:
            raise FolnetError(f"head {head!r} is unknown; use None or {choices(HEADS)}")
        if head in ("classification", "token-classification") and num_labels < 1:
            raise FolnetError(f"num_labels must be >= 1 for head {head!r}, got {num_labels}")
        self.cfg = cfg
        self.head = head
        self.num_labels = num_labels
        self.encoder = FolnetEncoder(cfg)
        self.mlm = (MLMHead(cfg, self.encoder.atoms.word)
                    if head in ("pretraining", "mlm") else None)
        if head == "pretraining":
            self.nsp = nn.Linear(cfg.D1, 2)
        elif head == "classification":
            self.classifier = PoolerClassifier(cfg.D1, num_labels, cfg.dropout)
        elif head == "multiple-choice":
            self.classifier = PoolerClassifier(cfg.D1, 1, cfg.dropout)
        elif head == "qa":
            self.qa = nn.Linear(cfg.D1, 2)
        elif head == "token-classification":
            self.dropout = nn.Dropout(cfg.dropout)
            self.classifier = nn.Linear(cfg.D1, num_labels)
        self.gather_mlm = False  # training sets it: logits only at predicted positions
        # whether forward computes relation_output (the final binary stream); no built-in
        # head reads it, so the training loops turn it off and the last layer skips its
        # binary-stream updates
        self.relations = True
        self.reset_parameters()

    @property
    def plan(self) -> ArchPlan:
        return self.encoder.plan

    def reset_parameters(self) -> None:
        """BERT-style init: N(0, initializer_range) weights and embeddings, zero biases."""
        std = self.cfg.initializer_range
        for name, param in self.named_parameters():
            if name.endswith("bias"):
                nn.init.zeros_(param)
            else:
                nn.init.normal_(param, mean=0.0, std=std)

    def save_pretrained(self, directory, extra=None):
        """Write ``config.json`` + ``model.safetensors`` (see `folnet.arch.checkpoint`)."""
        from folnet.arch.checkpoint import save_pretrained

        return save_pretrained(self, directory, extra)

    def set_activation_checkpointing(self, enabled: bool = True) -> None:
        self.encoder.checkpointing = bool(enabled)

    def forward(self, input_ids, token_type_ids=None, attention_mask=None, *, labels=None,
                mlm_labels=None, nsp_labels=None, start_positions=None, end_positions=None):
        if self.head == "multiple-choice":
            return self._multiple_choice(input_ids, token_type_ids, attention_mask, labels)
        token_type_ids, pad = check_inputs(self.cfg, input_ids, token_type_ids, attention_mask)
        seq, pooled, rel = self.encoder(input_ids, token_type_ids, pad, self.relations)
        out = FolnetOutput(sequence_output=seq, pooled_output=pooled, relation_output=rel)
        losses = []
        if self.mlm is not None:
            if mlm_labels is not None:
                if tuple(mlm_labels.shape) != tuple(input_ids.shape):
                    raise FolnetError(f"mlm_labels shape {tuple(mlm_labels.shape)} differs from "
                                      f"input_ids shape {tuple(input_ids.shape)}")
                if self.gather_mlm:
                    hidden, kept = gather_masked(seq, mlm_labels)
                    out.mlm_logits = self.mlm(hidden)[..., : self.cfg.vocab_size]
                    out.mlm_labels = kept
                else:
                    out.mlm_logits = self.mlm(seq)[..., : self.cfg.vocab_size]
                    kept = mlm_labels
                losses.append(mlm_loss(out.mlm_logits, kept))
            else:
                out.mlm_logits = self.mlm(seq)[..., : self.cfg.vocab_size]
        if self.head == "pretraining":
            out.nsp_logits = self.nsp(pooled)
            if nsp_labels is not None:
                losses.append(F.cross_entropy(out.nsp_logits.float(), nsp_labels))
        elif self.head == "classification":
            out.logits = self.classifier(pooled)
            if labels is not None:
                if self.num_labels == 1:
                    losses.append(F.mse_loss(out.logits.squeeze(-1).float(), labels.float()))
                else:
                    losses.append(F.cross_entropy(out.logits.float(), labels))
        elif self.head == "qa":
            out.logits = self.qa(seq)  # (B, T, 2)
            out.start_logits, out.end_logits = out.logits.unbind(-1)
            if start_positions is not None and end_positions is not None:
                losses.append(0.5 * (F.cross_entropy(out.start_logits.float(), start_positions)
                                     + F.cross_entropy(out.end_logits.float(), end_positions)))
        elif self.head == "token-classification":
            out.logits = self.classifier(self.dropout(seq))  # (B, T, C)
            if labels is not None:
                losses.append(F.cross_entropy(out.logits.flatten(0, 1).float(),
                                              labels.flatten(), ignore_index=-100))
        if losses:
            out.loss = torch.stack(losses).sum()
        return out

    def _multiple_choice(self, input_ids, token_type_ids, attention_mask, labels):
        if not isinstance(input_ids, torch.Tensor) or input_ids.ndim != 3:
            raise FolnetError("multiple-choice input_ids must have shape (batch, choices, "
                              f"tokens), got {tuple(getattr(input_ids, 'shape', ()))}")
        B, C, T = input_ids.shape
        flat = [None if t is None else t.reshape(B * C, T)
                for t in (token_type_ids, attention_mask)]
        ids, pad = check_inputs(self.cfg, input_ids.reshape(B * C, T), flat[0], flat[1])
        seq, pooled, rel = self.encoder(input_ids.reshape(B * C, T), ids, pad, self.relations)
        logits = self.classifier(pooled).view(B, C)
        out = FolnetOutput(seq.view(B, C, T, -1), pooled.view(B, C, -1),
                           None if rel is None else rel.view(B, C, T, T, -1), logits=logits)
        if labels is not None:
            out.loss = F.cross_entropy(logits.float(), labels)
        return out
