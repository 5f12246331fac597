"""How long the README's quick start takes: the bundled kinship-tiny pretraining and the
kinship-finetune run after it, each as the command a user types, timed from the shell.

    python benchmarks/recipe_time.py --json docs/figures/kinship_recipe.json
    python benchmarks/recipe_time.py --steps 20 --finetune-steps 20     # a smoke run

For each run the record holds the wall time of the whole command (start-up, corpus and
tokenizer, every step, the checkpoints), its step count, the steady seconds per step (the
median over the logged intervals, read from the run's log.jsonl) and the seconds before that
rate (the first steps and everything before them), and the load average before and after:
the time on a loaded machine is not this one. The estimates that the Makefile, the bundled
configs, the README and the quick start page state are this file's figures
(tests/project/test_recipe_time.py holds them to it).
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import machine, write_json

from folnet import read_files
from folnet.train.engine.runlog import read_log

#: The quick start's two commands (README "Quick start"), less the progress bar.
PRETRAIN = ["pretrain", "--config", "kinship-tiny", "--no-progress", "--no-tensorboard"]
FINETUNE = ["finetune", "--config", "kinship-finetune", "--no-progress", "--no-tensorboard"]
#: The bundled configs, where each run's own step count is read.
SPECS = Path(__file__).resolve().parent.parent / "folnet" / "specs" / "train"


def config_steps(name: str, key: str) -> int:
    """The step count the bundled config ``name`` sets under ``key``."""
    return int(read_files.load(SPECS / f"{name}.toml")[key])


def vector_isa() -> str:
    """The widest x86 vector extension the CPU reports (AVX-512 changes the step's time)."""
    try:
        flags = set(Path("/proc/cpuinfo").read_text().split())
    except OSError:
        return "unknown"
    for flag, name in (("avx512f", "AVX-512"), ("avx2", "AVX2"), ("avx", "AVX")):
        if flag in flags:
            return name
    return "SSE"


def steady_rate(records: list[dict]) -> tuple[float, float]:
    """Seconds per step once the run is under way (the median of the logged intervals) and
    the seconds the run spent beyond that rate (the first steps, which are slower)."""
    points = [(0, 0.0)] + [(int(r["step"]), float(r["elapsed"])) for r in records
                           if "step" in r and "elapsed" in r]
    rates = [(t1 - t0) / (s1 - s0) for (s0, t0), (s1, t1) in itertools.pairwise(points)
             if s1 > s0]
    if not rates:
        raise ValueError("the log holds no step with a time")
    rate = statistics.median(rates)
    last_step, last_time = points[-1]
    return rate, max(0.0, last_time - rate * last_step)


def _timed_run(args: list[str], out: Path, full_steps: int) -> dict:
    load = os.getloadavg()[0]
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "folnet", *args, "--out", str(out)], check=True,
                   stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - start
    logs = sorted(out.glob("log.jsonl")) + sorted(out.glob("seed_*/log.jsonl"))
    records = read_log(logs[0])
    rate, slower = steady_rate(records)
    steps = max(int(r["step"]) for r in records if "step" in r)
    return {"command": "folnet " + " ".join(args), "steps": steps, "wall_s": round(wall, 1),
            "minutes": round(wall / 60, 2), "seconds_per_step": round(rate, 3),
            # the wall time beyond steps x rate: start-up, the corpus, the slower first steps
            "beyond_the_steps_s": round(wall - rate * steps, 1),
            "first_steps_beyond_the_rate_s": round(slower, 1),
            "config_steps": full_steps,
            "estimate_minutes": round((wall + rate * (full_steps - steps)) / 60, 2),
            "load_before": round(load, 2), "load_after": round(os.getloadavg()[0], 2)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=None,
                        help="pretraining steps (default: the config's own)")
    parser.add_argument("--finetune-steps", type=int, default=None,
                        help="finetuning steps (default: the config's own)")
    parser.add_argument("--json", type=Path, default=None, help="write the record here")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="recipe-time-") as tmp:
        pre, ft = Path(tmp) / "kinship-tiny", Path(tmp) / "kinship-ft"
        extra = ["--steps", str(args.steps)] if args.steps else []
        pretrain = _timed_run([*PRETRAIN, *extra], pre, config_steps("kinship-tiny", "steps"))
        extra = ["--max-steps", str(args.finetune_steps)] if args.finetune_steps else []
        finetune = _timed_run([*FINETUNE, "--from", str(pre), *extra], ft,
                              config_steps("kinship-finetune", "max_steps"))
        for run in (pretrain, finetune):  # the paths as the quick start names them
            run["command"] = run["command"].replace(tmp, "runs")
    record = {"machine": {**machine(), "vector_isa": vector_isa()}, "pretrain": pretrain,
              "finetune": finetune}
    for name in ("pretrain", "finetune"):
        run = record[name]
        print(f"{name}: {run['steps']} steps in {run['minutes']:.1f} minutes "
              f"({run['seconds_per_step']:.3f} s a step, load {run['load_before']:.2f} before); "
              f"{run['config_steps']} steps: {run['estimate_minutes']:.1f} minutes")
    if args.json:
        write_json(args.json, record)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
