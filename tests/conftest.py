import os
import sys

import pytest
import torch

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# The test files live in folders by what they test (ops/, arch/, hf/, data/, train/, project/);
# the helpers they share (tolerances, paths, runs, ...) are the modules of tests/ itself, which
# every folder imports by name. The folders are not packages: pytest imports each test file by
# its bare name, so no two test files may share one.
sys.path.insert(0, os.path.dirname(__file__))
#: transformers' own tests run on folnet (``make conformance``, tests/conformance/run.py): a
#: package of their own, copied beside transformers' test files, not collected here.
collect_ignore = ["conformance"]


#: Test processes sharing this machine: `make test` runs ``pytest -n 2`` (pytest-xdist).
WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
#: Intra-op threads a test may use: the cores divided among the workers, so that two workers
#: on two cores do not each start two threads and fight over them.
THREADS = max(1, len(os.sched_getaffinity(0)) // WORKERS)
torch.set_num_threads(THREADS)


def _expected_seconds(item: pytest.Item) -> float:
    marker = item.get_closest_marker("slow") or item.get_closest_marker("long")
    return 0.0 if marker is None else float(marker.kwargs.get("seconds", 10))


def pytest_collection_modifyitems(config, items):
    """Longest first: ``slow`` and ``long`` tests, by their ``seconds`` estimate where they give
    one. Under ``pytest -n 2 --dist loadfile --no-loadscope-reorder`` (make test) whole files
    go to the workers in this order, so the long ones start early and neither worker is left
    running one at the end while the other idles."""
    items.sort(key=lambda item: -_expected_seconds(item))


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


@pytest.fixture
def trans_first():
    """A registered operator whose kernel reduces over the binary stream's first index (the
    transpose of ``t``'s reading); yields its symbol."""
    import folnet

    folnet.register_operator(symbol="r", name="trans_first", typing="B <- B x B",
                             kernel="a x h", premise="a y h", output="x y h", bdim="h",
                             rdim="a", activation="softmax", mask=["kernel", "premise"],
                             sizes={"h": "D2"})
    yield "r"
    folnet.unregister_operator("r")
