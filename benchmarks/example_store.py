"""Why the tokenised pretraining examples are stored as memory-mapped .npy arrays, not Arrow.

    python benchmarks/example_store.py --examples 50000 --reads 20000

The map-style pretraining dataset is read in a random order, one example per `__getitem__`. This
writes the same synthetic examples (segment A, segment B, label; 10-60 tokens each) both ways --
the three flat arrays `folnet.train.data.corpus` writes (tokens, offsets, len_a) opened with
``np.load(mmap_mode="r")``, and a `datasets.Dataset` saved with ``save_to_disk`` and opened with
``load_from_disk`` (python-object and numpy formats) -- then times random single-example reads,
interleaving the three stores in rounds so that load on a shared machine falls on all alike.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable

import numpy as np

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=50_000, help="examples stored")
    parser.add_argument("--reads", type=int, default=20_000, help="random reads per store")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds")
    args = parser.parse_args()

    import datasets

    datasets.disable_progress_bars()
    rng = np.random.default_rng(0)
    n = args.examples
    len_a, len_b = rng.integers(10, 60, n), rng.integers(10, 60, n)
    tokens = rng.integers(5, 30_000, int((len_a + len_b).sum())).astype(np.int32)
    offsets = np.concatenate([[0], np.cumsum(len_a + len_b)])
    folder = tempfile.mkdtemp()
    for name, array in (("tokens", tokens), ("offsets", offsets), ("len_a", len_a)):
        np.save(f"{folder}/{name}.npy", array)
    mm = {name: np.load(f"{folder}/{name}.npy", mmap_mode="r")
          for name in ("tokens", "offsets", "len_a")}
    table = datasets.Dataset.from_dict({
        "a": [tokens[offsets[i]: offsets[i] + len_a[i]] for i in range(n)],
        "b": [tokens[offsets[i] + len_a[i]: offsets[i + 1]] for i in range(n)],
        "label": rng.integers(0, 2, n).astype(np.int8)})
    table.save_to_disk(f"{folder}/arrow")
    arrow = datasets.load_from_disk(f"{folder}/arrow")
    arrow_numpy = arrow.with_format("numpy")

    def memmap_read(i: int) -> None:
        start, end = int(mm["offsets"][i]), int(mm["offsets"][i + 1])
        ids = np.asarray(mm["tokens"][start:end], dtype=np.int64)
        _a, _b = ids[: int(mm["len_a"][i])], ids[int(mm["len_a"][i]):]

    stores: dict[str, Callable[[int], object]] = {
        "npy memmap": memmap_read,
        "Arrow (python)": lambda i: arrow[i],
        "Arrow (numpy)": lambda i: arrow_numpy[i]}
    per_read: dict[str, list[float]] = {name: [] for name in stores}
    indices = [int(i) for i in rng.integers(0, n, args.reads)]
    chunk = max(1, args.reads // args.rounds)
    for r in range(args.rounds):
        part = indices[r * chunk:(r + 1) * chunk]
        for name, read in stores.items():
            start = time.perf_counter()
            for i in part:
                read(i)
            per_read[name].append((time.perf_counter() - start) / len(part))
    base = statistics.median(per_read["npy memmap"])
    print(f"{n} examples, {args.reads} random reads per store, {args.rounds} interleaved rounds")
    for name, times in per_read.items():
        median = statistics.median(times)
        print(f"{name:16s} {median * 1e6:8.1f} us/example  ({median / base:5.1f}x memmap)")


if __name__ == "__main__":
    main()
