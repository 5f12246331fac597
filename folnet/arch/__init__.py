"""Architectures from operator strings: plans, layers, stacks, heads, checkpoints."""

from folnet.arch.build import build_model
from folnet.arch.checkpoint import from_pretrained, save_pretrained
from folnet.arch.config import ModelConfig
from folnet.arch.model import FolnetModel, FolnetOutput
from folnet.arch.official import load_official
from folnet.arch.plan import ArchPlan, LayerPlan, parse_layer, parse_plan

__all__ = [
    "ArchPlan",
    "FolnetModel",
    "FolnetOutput",
    "LayerPlan",
    "ModelConfig",
    "build_model",
    "from_pretrained",
    "load_official",
    "parse_layer",
    "parse_plan",
    "save_pretrained",
]
