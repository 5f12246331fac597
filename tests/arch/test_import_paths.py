"""The layer's import path from the package gives the very object of its module."""

from __future__ import annotations


def test_old_layer_path_gives_the_layer():
    from folnet.arch.layer import DualStreamLayer
    from folnet.arch.layer.dual_stream import DualStreamLayer as moved

    assert DualStreamLayer is moved
