"""Architectures from operator strings: plans, the dual-stream layer and stack, the kinds of
model and their heads, checkpoints.

Data flows one way: operator string -> `ArchPlan` (`plan`) -> `DualStreamLayer`s in a `Stack`
(`layer`, `stack`) -> a model of one kind (`models`, found by kind in `kinds`) with a head
(`heads`) -> checkpoints (`checkpoint`, `build`, `official`).
"""

from folnet.arch.build import build_model, from_pretrained, model_from_config
from folnet.arch.config import KINDS, POSITIONS, PRESETS, ModelConfig
from folnet.arch.config import preset as load_preset
from folnet.arch.convert import load_official
from folnet.arch.head_table import HEADS, Head, register_head
from folnet.arch.heads import unregister_head
from folnet.arch.info import model_info
from folnet.arch.io.model_dir import (
    ensure_operators,
    load_weights,
    read_metadata,
    read_weights,
    resolve_model_dir,
    run_checkpoints,
    save_pretrained,
)
from folnet.arch.layer.memory_modes import MEMORY_MODES, set_memory
from folnet.arch.models import FolnetDecoderLM, FolnetEncoderDecoder, FolnetModel
from folnet.arch.outputs import FolnetOutput, TextOutput
from folnet.arch.plan import ArchPlan, LayerPlan, parse_layer, parse_plan

__all__ = [
    "HEADS",
    "KINDS",
    "MEMORY_MODES",
    "POSITIONS",
    "PRESETS",
    "ArchPlan",
    "FolnetDecoderLM",
    "FolnetEncoderDecoder",
    "FolnetModel",
    "FolnetOutput",
    "Head",
    "LayerPlan",
    "ModelConfig",
    "TextOutput",
    "build_model",
    "ensure_operators",
    "from_pretrained",
    "load_official",
    "load_preset",
    "load_weights",
    "model_from_config",
    "model_info",
    "parse_layer",
    "parse_plan",
    "read_metadata",
    "read_weights",
    "register_head",
    "resolve_model_dir",
    "run_checkpoints",
    "save_pretrained",
    "set_memory",
    "unregister_head",
]
