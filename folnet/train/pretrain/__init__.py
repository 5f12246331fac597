"""Pretraining: MLM + NSP/SOP over a corpus, with LAMB/AdamW, AMP, DDP/FSDP and exact resume."""

from folnet.train.pretrain.config import PretrainConfig, load_pretrain_config
from folnet.train.pretrain.loop import pretrain

__all__ = ["PretrainConfig", "load_pretrain_config", "pretrain"]
