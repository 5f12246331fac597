"""Architectures from operator strings: plans, layers, stacks, heads, checkpoints."""

from folnet.arch.build import build_model
from folnet.arch.checkpoint import (
    ensure_operators,
    from_pretrained,
    load_weights,
    read_metadata,
    read_weights,
    save_pretrained,
)
from folnet.arch.config import KINDS, POSITIONS, PRESETS, ModelConfig
from folnet.arch.config import preset as load_preset
from folnet.arch.info import model_info
from folnet.arch.model import FolnetModel, FolnetOutput
from folnet.arch.official import load_official
from folnet.arch.plan import ArchPlan, LayerPlan, parse_layer, parse_plan

__all__ = [
    "KINDS",
    "POSITIONS",
    "PRESETS",
    "ArchPlan",
    "FolnetModel",
    "FolnetOutput",
    "LayerPlan",
    "ModelConfig",
    "build_model",
    "ensure_operators",
    "from_pretrained",
    "load_official",
    "load_preset",
    "load_weights",
    "model_info",
    "parse_layer",
    "parse_plan",
    "read_metadata",
    "read_weights",
    "save_pretrained",
]
