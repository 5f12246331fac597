"""The import paths users may have written before arch/ was grouped into folders still work, and
give the very objects of the new paths (README, "What moved")."""

from __future__ import annotations

import importlib

import pytest


def test_old_layer_path_gives_the_layer():
    from folnet.arch.layer import DualStreamLayer
    from folnet.arch.layer.dual_stream import DualStreamLayer as moved

    assert DualStreamLayer is moved


@pytest.mark.parametrize("name", ["save_pretrained", "load_weights", "read_metadata",
                                  "read_weights", "resolve_model_dir", "ensure_operators"])
def test_old_checkpoint_path_is_the_model_dir_module(name):
    old = importlib.import_module("folnet.arch.checkpoint")
    new = importlib.import_module("folnet.arch.io.model_dir")
    assert old is new
    assert getattr(old, name) is getattr(new, name)
    assert getattr(importlib.import_module("folnet.arch"), name) is getattr(new, name)
