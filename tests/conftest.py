import os
import sys

import pytest
import torch

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, os.path.dirname(__file__))


@pytest.fixture(scope="module")
def one_thread():
    """Tiny tensors on 2 busy cores: one intra-op thread is faster and steadier.

    Modules opt in with ``pytestmark = pytest.mark.usefixtures("one_thread")``.
    """
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(autouse=True)
def _operator_registry_restored():
    """Operators a test registers -- itself or by loading a checkpoint that carries a custom
    operator -- are unregistered after it, so no test sees another's operators."""
    import folnet

    before = {spec.symbol for spec in folnet.operators()}
    yield
    for spec in folnet.operators():
        if spec.symbol not in before:
            folnet.unregister_operator(spec.symbol)
