"""The GPU path in one command: CUDA correctness tests, benchmarks, a short pretraining run.

    python benchmarks/gpu_check.py --out DIR                  # on a CUDA machine, ~8 minutes
    python benchmarks/gpu_check.py --out DIR --budget-s 300   # a tighter deadline
    python benchmarks/gpu_check.py --out DIR --dry-run        # the CPU rehearsal, < 1 minute

folnet runs from this source tree (no install needed; any working directory will do) on the
machine's own torch; nothing needs ``datasets``, ``zstandard`` or ``xformers``. Stages, each in
its own process (a crash or a hung kernel costs one stage, not the report):

1. ``cuda_tests``: pytest on tests/ops/test_cuda.py (plugin benchmarks/gpu_pytest.py), every
   test's outcome and the share of its tolerance each comparison used;
2. ``train_step``, ``ops``, ``generate``: benchmarks/gpu_bench.py (reusing train_step.py,
   ops.py, generate.py and the harness); ``speed``: benchmarks/gpu_speed.py -- the step
   census on the device (launches, syncs, the kernels torch's profiler saw) beside BERT, the
   pretraining step eager, compiled and with CUDA graphs beside BERT's, and the largest batch
   that fits;
3. ``pretrain``: benchmarks/gpu_pretrain.py, 200 steps fp32 and bf16 of the kinship-tiny run.

Writes DIR/report.json and DIR/report.md only, rewritten after every result (pytest's output
and the stages' progress go to stdout). Every stage gets a share of what is left of
``--budget-s`` and is stopped at its deadline; a stage with too little time left is marked
"skipped: out of time". ``--dry-run`` runs every stage on the CPU at toy sizes, with the tests
in rehearsal mode (FOLNET_GPU_REHEARSAL=1): tests/project/test_gpu_check.py runs it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
for _path in (str(BENCH), str(ROOT)):  # folnet from this tree, the benchmarks beside it
    if _path not in sys.path:
        sys.path.insert(0, _path)

from gpu_report import STAGES, Report  # noqa: E402

#: Each stage's share of the time left when it starts (later stages keep theirs).
SHARES = {"cuda_tests": 0.24, "train_step": 0.14, "speed": 0.30, "ops": 0.10,
          "generate": 0.08, "pretrain": 0.14}
#: A stage that would get less than this many seconds is skipped (GPU; the dry run: 2).
MIN_STAGE_S = 15.0
#: Seconds a stopped stage gets to exit on SIGTERM before SIGKILL, and kept for the last write.
GRACE_S = 5.0
TESTS = ROOT / "tests" / "ops" / "test_cuda.py"


def machine() -> dict:
    """What ran the check: torch, CUDA, the GPU (no CUDA context is created here)."""
    import torch
    from harness import machine as base

    info = {**base(), "python": platform.python_version(), "cores": os.cpu_count(),
            "cuda_version": torch.version.cuda, "cuda_available": torch.cuda.is_available()}
    info["gpu"] = info.pop("cuda")
    if not torch.cuda.is_available() and torch.version.cuda:
        try:  # a CUDA build that finds no device: torch's reason, for the report
            torch.cuda.init()
        except Exception as exc:
            info["cuda_error"] = str(exc).strip()[:500]
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info.update(gpu_memory_gib=round(props.total_memory / 2**30, 1),
                    capability=f"{props.major}.{props.minor}",
                    cudnn=torch.backends.cudnn.version())
    try:  # the driver, which torch does not report
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                              "--format=csv,noheader"], capture_output=True, text=True,
                             timeout=20, check=False)
        info["nvidia_smi"] = smi.stdout.strip() or None
    except (OSError, subprocess.TimeoutExpired):
        info["nvidia_smi"] = None
    for name in ("triton", "transformers", "xformers", "datasets"):
        try:
            info[name] = __import__(name).__version__
        except Exception:  # absent, or broken at import: either way not used
            info[name] = None
    return info


class Check:
    """Runs the stages one after another against one deadline, merging their events."""

    def __init__(self, args: argparse.Namespace, report: Report) -> None:
        self.args, self.report = args, report
        self.deadline = report.start + args.budget_s
        self.rows_dir = Path(tempfile.mkdtemp(prefix="folnet-gpu-check-"))
        self.child: subprocess.Popen | None = None

    def stage_budget(self, name: str) -> float:
        left = self.deadline - time.time() - GRACE_S
        names = [n for n in STAGES if n in self.args.stages]
        pending = sum(SHARES[n] for n in names[names.index(name):])
        return left * SHARES[name] / pending

    def command(self, name: str, rows: Path, deadline: float) -> tuple[list[str], dict]:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            [str(ROOT), str(BENCH), *filter(None, [os.environ.get("PYTHONPATH")])]),
               "FOLNET_GPU_CHECK_ROWS": str(rows), "PYTHONUNBUFFERED": "1",
               "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
        if self.args.dry_run:
            env["FOLNET_GPU_REHEARSAL"] = "1"
            env["CUDA_VISIBLE_DEVICES"] = ""  # the rehearsal is the CPU's, GPU or not
        if name == "cuda_tests":
            env["FOLNET_TOLERANCE_LOG"] = str(self.rows_dir / "tolerances.jsonl")
            return [sys.executable, "-m", "pytest", "-q", "-p", "gpu_pytest", "-p",
                    "no:cacheprovider", "--tb=short", "-rfE", str(TESTS)], env
        settings = {"dry_run": self.args.dry_run, "deadline": deadline}
        return [sys.executable, str(Path(__file__).resolve()), "--child", name,
                "--settings", json.dumps(settings)], env

    def run_stage(self, name: str) -> None:
        stage = self.report.stage(name)
        budget = self.stage_budget(name)
        if budget < (2.0 if self.args.dry_run else MIN_STAGE_S):
            stage["status"] = "skipped: out of time"
            self.report.write()
            return
        rows = self.rows_dir / f"{name}.jsonl"
        deadline = time.time() + budget
        cmd, env = self.command(name, rows, deadline)
        stage.update(status="running", budget_s=round(budget, 1))
        self.report.write()
        print(f"== {name}: {budget:.0f} s", flush=True)
        start = time.time()
        rc, stopped, tail = self.watch(name, cmd, env, rows, deadline)
        stage["seconds"] = round(time.time() - start, 1)
        if stopped:
            stage["status"] = f"stopped at its deadline ({budget:.0f} s): out of time"
        elif rc == 0 or (name == "cuda_tests" and rc == 1):  # pytest: 1 = some tests failed
            stage["status"] = "done"
        else:
            stage["status"] = f"failed: exit status {rc}"
            stage.setdefault("error", tail)
        if name == "cuda_tests":
            stage["tolerances"] = tolerance_shares(self.rows_dir / "tolerances.jsonl")
        self.report.write()

    def watch(self, name: str, cmd: list[str], env: dict, rows: Path, deadline: float
              ) -> tuple[int | None, bool, str]:
        """Run a stage's process, passing its output on and merging its events every second;
        stop it past ``deadline``. Returns its exit status, whether it was stopped, and the
        tail of its output."""
        output = rows.with_suffix(".log")
        with open(output, "wb") as log:
            self.child = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log,
                                          stderr=subprocess.STDOUT, start_new_session=True)
        stopped, offsets = False, [0, 0]  # rows file, output file
        while True:
            try:
                rc = self.child.wait(timeout=1.0)
            except subprocess.TimeoutExpired:
                rc = None
            offsets[0] = self.merge(name, rows, offsets[0])
            offsets[1] = self.pass_on(output, offsets[1])
            if rc is not None:
                break
            if time.time() > deadline + GRACE_S:
                self.stop_child()
                stopped = True
        self.child = None
        self.merge(name, rows, offsets[0])
        self.pass_on(output, offsets[1])
        return rc, stopped, output.read_bytes()[-3000:].decode("utf-8", "replace")

    @staticmethod
    def pass_on(output: Path, offset: int) -> int:
        """Copy what the stage printed since ``offset`` to this process's stdout."""
        with open(output, "rb") as fh:
            fh.seek(offset)
            data = fh.read()
        sys.stdout.write(data.decode("utf-8", "replace"))
        sys.stdout.flush()
        return offset + len(data)

    def merge(self, name: str, rows: Path, offset: int) -> int:
        """Apply the complete lines the stage wrote since ``offset``; returns the new offset."""
        if not rows.exists():
            return offset
        with open(rows, "rb") as fh:
            fh.seek(offset)
            data = fh.read()
        done = data.rfind(b"\n") + 1
        for line in data[:done].decode("utf-8", "replace").splitlines():
            try:
                self.report.apply(name, json.loads(line))
            except (json.JSONDecodeError, KeyError, TypeError):
                self.report.data["notes"].append(f"{name}: unreadable event {line[:200]!r}")
        if done:
            self.report.write()
        return offset + done

    def close(self) -> None:
        """Remove the stages' event and output files (their content is in the report)."""
        shutil.rmtree(self.rows_dir, ignore_errors=True)

    def stop_child(self) -> None:
        """SIGTERM to the stage's process group (it started one), then SIGKILL."""
        if self.child is None or self.child.poll() is not None:
            return
        for sig, wait in ((signal.SIGTERM, GRACE_S), (signal.SIGKILL, GRACE_S)):
            try:
                os.killpg(self.child.pid, sig)
            except ProcessLookupError:
                return
            try:
                self.child.wait(timeout=wait)
                return
            except subprocess.TimeoutExpired:
                continue


def tolerance_shares(path: Path) -> list[dict]:
    """Per test, the comparison that used the largest share of its bound (measured / bound;
    the rtol/atol and token-lead records are shares already), largest first."""
    worst: dict[str, dict] = {}
    if path.exists():
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                r = json.loads(line)
                share = float(r["measured"]) / float(r["bound"]) if r["bound"] else 0.0
            except (json.JSONDecodeError, KeyError, TypeError, ValueError):
                continue
            test = r["test"].split("::", 1)[-1]
            if test not in worst or share > worst[test]["share"]:
                worst[test] = {"test": test, "what": r["what"], "metric": r["metric"],
                               "share": share}
    return sorted(worst.values(), key=lambda r: -r["share"])


def orchestrate(args: argparse.Namespace) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report = Report(out, machine(), {"budget_s": args.budget_s, "dry_run": args.dry_run,
                                     "stages": args.stages})
    if not args.dry_run and not report.data["machine"]["cuda_available"]:
        why = report.data["machine"].get("cuda_error") or "no CUDA build or no device"
        report.data["notes"].append(f"torch sees no CUDA device ({why}): nothing was run (use "
                                    f"--dry-run for the CPU rehearsal)")
        report.write(finished=True)
        print("no CUDA device: use --dry-run for the CPU rehearsal", file=sys.stderr)
        return 2
    check = Check(args, report)

    def on_term(signum: int, frame: object) -> None:  # the caller's timeout: keep the report
        check.stop_child()
        report.data["notes"].append(f"stopped by signal {signum}")
        for stage in report.data["stages"].values():
            if stage["status"] == "running":
                stage["status"] = f"stopped by signal {signum}"
        report.write()
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, on_term)
    try:
        for name in STAGES:
            if name in args.stages:
                check.run_stage(name)
            else:
                report.stage(name)["status"] = "skipped: not asked for (--stages)"
    finally:
        check.close()
    report.write(finished=True)
    print(f"wrote {out / 'report.json'} and {out / 'report.md'}", flush=True)
    failed = report.stage("cuda_tests").get("summary", {}).get("failed", 0)
    return 1 if failed else 0


def child(name: str, settings: dict) -> int:
    """Run one stage in this process, its events to $FOLNET_GPU_CHECK_ROWS."""
    from gpu_stage import StageContext

    ctx = StageContext(os.environ["FOLNET_GPU_CHECK_ROWS"], settings)
    try:
        if name == "pretrain":
            from gpu_pretrain import pretrain_stage as run
        elif name == "speed":
            from gpu_speed import speed_stage as run
        else:
            import gpu_bench

            run = getattr(gpu_bench, f"{name}_stage")
        run(ctx)
    except Exception:
        ctx.set("error", traceback.format_exc()[-3000:])
        raise
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="folder for report.json and report.md (created)")
    ap.add_argument("--budget-s", type=float, default=480.0,
                    help="seconds for the whole check (default 480); stages share what is left")
    ap.add_argument("--dry-run", action="store_true",
                    help="the CPU rehearsal: every stage at toy sizes, tests in rehearsal mode")
    ap.add_argument("--stages", default=",".join(STAGES),
                    help=f"comma-separated subset of {', '.join(STAGES)}")
    ap.add_argument("--child", help=argparse.SUPPRESS)  # internal: run one stage
    ap.add_argument("--settings", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        return child(args.child, json.loads(args.settings))
    if not args.out:
        ap.error("--out DIR is required")
    if args.budget_s <= 0:
        ap.error(f"--budget-s must be positive, got {args.budget_s}")
    args.stages = [s.strip() for s in args.stages.split(",") if s.strip()]
    unknown = sorted(set(args.stages) - set(STAGES))
    if unknown:
        ap.error(f"unknown stage(s) {', '.join(unknown)}; use {', '.join(STAGES)}")
    return orchestrate(args)


if __name__ == "__main__":
    sys.exit(main())
