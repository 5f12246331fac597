"""What a training step holds at its peak, tensor by tensor, from torch's memory profiler.

    python benchmarks/step_tensors.py                          # small, T 512, batch 2, checkpointed
    python benchmarks/step_tensors.py --preset base --batch 1 --json results/step_tensors.json

Builds the model as `benchmarks/long_memory.py` does (pretraining head, as ``folnet pretrain``
runs it, activation checkpointing on, the memory mode ``auto``), takes one short AdamW step
so that gradients and optimizer state exist, then profiles one MLM + NSP step at the measured
length with ``profile_memory``. The profiler's timeline (every allocation and free, each
tensor with the category torch's memory profiler gives it: activation, temporary, gradient,
autograd detail, ...) is replayed to find the moment the step's own memory peaks; the table
lists what is alive then, grouped by category, the op that made it and its shape, in MiB and
in units of U = B x T^2 x D2 x 4 bytes (one float32 binary-stream tensor). Tensors that
existed before the step (weights, gradients, AdamW state) are the steady state and left out,
as `benchmarks/long_memory.py` leaves them out of its peak.

torch's memory profiler is a private module (``torch.profiler._memory_profiler``): this script
is a measurement, not part of folnet, and says so when a torch lacks it.
"""

from __future__ import annotations

import argparse
import collections
import importlib.util
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import machine, write_json
from long_memory import _batch

import folnet
from folnet.runtime import tune_cpu_allocator


def _shapes(prof: profile) -> dict:
    """TensorKey -> (op, shape): the op that allocated each tensor (the profiler's data-flow
    graph) and its shape as the first op that reads it saw it."""
    from torch.profiler._memory_profiler import TensorKey

    memory = prof._memory_profile()
    made: dict = {}
    for node in memory._data_flow_graph.flow_nodes:
        for key, edge in node._edges.items():
            if edge.is_allocation and key not in made:
                made[key] = node._event.name
    shape: dict = {}
    for event in memory._op_tree.dfs():
        for meta in _tensors(getattr(event.typed[1], "inputs", ())):
            key = TensorKey.from_tensor(meta)
            if key is not None and key not in shape:
                shape[key] = tuple(meta.sizes)
    return {key: (made.get(key, "?"), shape.get(key, ())) for key in made.keys() | shape.keys()}


def _tensors(inputs) -> list:
    """The tensor metadata among an op's recorded inputs (lists of tensors included)."""
    found = []
    for item in inputs or ():
        for meta in item if isinstance(item, list) else [item]:
            if hasattr(meta, "sizes") and hasattr(meta, "allocation_id"):
                found.append(meta)
    return found


def peak_tensors(prof: profile) -> tuple[int, list[tuple[str, str, tuple, int]]]:
    """The step's peak (bytes above what existed before it) and what is alive at it:
    (category, op, shape, bytes) per tensor."""
    from torch.profiler._memory_profiler import Action, TensorKey

    memory = prof._memory_profile()
    categories = memory._categories
    live: dict = {}
    current = best = 0
    snapshot: dict = {}
    for t, action, (key, version), nbytes in memory.timeline:
        if t == -1 or key.device.type != "cpu":  # -1: existed before the profile (steady)
            continue
        if action == Action.CREATE:
            current += nbytes - live.get((key, version), 0)
            live[(key, version)] = nbytes
        elif action == Action.DESTROY:
            current -= live.pop((key, version), 0)
        elif action == Action.INCREMENT_VERSION and (key, version) in live:
            # written in place: the same bytes under the next version (a tensor from before
            # the step, a gradient accumulated into, stays steady state: not in ``live``)
            live[(key, version + 1)] = live.pop((key, version))
        if current > best:
            best, snapshot = current, dict(live)
    shapes = _shapes(prof)
    rows = []
    for (key, version), nbytes in snapshot.items():
        category = (categories.get(key, version) if isinstance(key, TensorKey) else None)
        op, shape = shapes.get(key, ("?", ()))
        rows.append((getattr(category, "name", "UNKNOWN"), op, shape, nbytes))
    return best, rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ops", default="jmc.atp")
    ap.add_argument("--preset", default="small")
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--checkpointing", default="on", choices=("on", "off"))
    ap.add_argument("--mode", default="auto", help="memory mode (folnet.set_memory)")
    ap.add_argument("--top", type=int, default=20, help="rows of the table")
    ap.add_argument("--json", default=None, help="also write the table here")
    args = ap.parse_args(argv)
    if importlib.util.find_spec("torch.profiler._memory_profiler") is None:
        print(f"torch {torch.__version__} has no memory profiler module; nothing measured")
        return 2
    tune_cpu_allocator(args.seq_len)
    torch.manual_seed(0)
    model = folnet.build_model(args.ops, preset=args.preset, head="pretraining",
                               vocab_size=args.vocab).train()
    model.gather_mlm, model.relations = True, False
    model.set_activation_checkpointing(args.checkpointing == "on")
    folnet.set_memory(model, args.mode)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step(seq_len: int) -> None:
        ids, types, labels, nsp = _batch(args.batch, seq_len, args.vocab)
        opt.zero_grad(set_to_none=False)
        model(ids, types, mlm_labels=labels, nsp_labels=nsp).loss.backward()
        opt.step()

    step(16)  # the steady state: gradients and AdamW state exist
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True,
                 with_stack=True) as prof:
        step(args.seq_len)
    peak, rows = peak_tensors(prof)
    cfg = model.cfg
    unit = args.batch * args.seq_len ** 2 * cfg.D2 * 4
    groups: dict = collections.defaultdict(lambda: [0, 0])
    for category, op, shape, nbytes in rows:
        groups[(category, op, shape)][0] += 1
        groups[(category, op, shape)][1] += nbytes
    table = sorted(groups.items(), key=lambda kv: -kv[1][1])
    print(f"{args.ops} {args.preset}, T {args.seq_len}, batch {args.batch}, checkpointing "
          f"{args.checkpointing}, memory mode {args.mode}: the step's peak {peak / 2**20:.0f} "
          f"MiB above the steady state = {peak / unit:.1f} U (U = {unit / 2**20:.0f} MiB)")
    print("| category | made by | shape | tensors | MiB | U |\n|---|---|---|---:|---:|---:|")
    for (category, op, shape), (count, nbytes) in table[:args.top]:
        print(f"| {category} | {op} | {'x'.join(map(str, shape)) or '?'} | {count} | "
              f"{nbytes / 2**20:.1f} | {nbytes / unit:.2f} |")
    if len(table) > args.top:
        rest = sum(n for _, (_, n) in table[args.top:])
        print(f"| (the rest: {len(table) - args.top} groups) | | | | {rest / 2**20:.1f} | "
              f"{rest / unit:.2f} |")
    if args.json:
        write_json(args.json, {"machine": machine(), "args": vars(args), "peak_bytes": peak,
                               "unit_bytes": unit, "rows": [
                                   {"category": c, "op": o, "shape": list(s), "tensors": k,
                                    "bytes": n} for (c, o, s), (k, n) in table]})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
