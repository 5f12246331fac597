"""`folnet ablate --jobs N`: seed processes never outlive their ablate, a seed that is running
elsewhere is not started twice, seeds of one row run side by side, the costliest rows' first,
and row logs survive a kill and a resume intact.

The killed ablates run as real subprocesses on a plan whose rows pretrain for far more steps
than the test waits, so the rows are alive when their parent is killed. Processes are found by
their command line in /proc (it names the test's unique output directory); whatever a test
started is killed in its ``finally`` so a failing test leaves nothing behind.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from paths import ROOT
from runs import tiny_plan

from folnet.cli import main as cli_main
from folnet.train.ablate.parallel import STOP_GRACE_SECONDS
from folnet.train.ablate.plan import load_plan
from folnet.train.ablate.run import seed_units
from folnet.train.ablate.seeds import row_cost
from folnet.train.engine.lock import RunLock, lock_holder

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not Path("/proc/self/cmdline").is_file(),
                                 reason="needs /proc (Linux) to find the row processes")]


PLAN = tiny_plan("procs", """
[[rows]]
ops = "j.a"
name = "first"

[[rows]]
ops = "j.a"
D2 = 8
name = "second"
""", steps="STEPS", save_every=100000)
ROWS = ("first", "second")


def _plan(tmp_path: Path, steps: int) -> Path:
    path = tmp_path / "plan.toml"
    path.write_text(PLAN.replace("STEPS", str(steps)))
    return path


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}


def _terminal_signals() -> None:
    """Ctrl-C's default action, as in a terminal's foreground job: a test suite started in
    the background (``make test &``, a CI runner) ignores SIGINT, every child inherits that,
    and Python then keeps ignoring it, as POSIX asks of a program started so."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _start(plan: Path, out: Path, *extra: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "folnet", "ablate", str(plan), "--out", str(out),
           "--no-progress", *extra]
    log = (out.parent / f"{out.name}-parent.log").open("ab")
    try:
        return subprocess.Popen(cmd, env=_env(), stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, preexec_fn=_terminal_signals)
    finally:
        log.close()


def _alive(pid: int) -> bool:
    """A process that exists and is not a zombie (a killed child nobody reaped yet)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def _row_procs(out: Path) -> dict[int, str]:
    """pid -> row name of every live row process of the ablate writing into ``out``."""
    found = {}
    needle = str(out).encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if needle in argv and b"--rows" in argv and _alive(int(entry.name)):
            found[int(entry.name)] = argv[argv.index(b"--rows") + 1].decode()
    return found


def _lines(path: Path) -> int:
    return _read(path).count(b"\n")


def _wait(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.2)


def _rows_pretraining(out: Path, steps: int = 2) -> bool:
    """Both rows have a live process that has said it pretrains and logged ``steps`` steps."""
    return (sorted(_row_procs(out).values()) == sorted(ROWS)
            and all(b"pretraining j.a" in _read(out / f"{r}.log") for r in ROWS)
            and all(_lines(out / "rows" / r / "seed_0" / "pretrain" / "log.jsonl") >= steps
                    for r in ROWS))


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:
        return b""


def _cleanup(out: Path, *procs: subprocess.Popen) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    for pid in _row_procs(out):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _row_holder_pid(out: Path, row: str) -> object:
    holder = lock_holder(out / "rows" / row / "seed_0")
    return None if holder is None else holder.get("pid")


def _exit_status(parent: subprocess.Popen, tmp_path: Path, out: Path) -> int:
    """The stopped ablate's exit status: its rows get `STOP_GRACE_SECONDS` to unwind before
    they are killed, so that plus time for a loaded machine; past it, fail with the logs."""
    try:
        return parent.wait(timeout=STOP_GRACE_SECONDS + 20)
    except subprocess.TimeoutExpired:
        logs = [tmp_path / "out-parent.log", *(out / f"{r}.log" for r in ROWS)]
        raise AssertionError("the ablate did not exit after the signal; its logs:\n" + "\n".join(
            f"-- {p.name}:\n{_read(p).decode(errors='replace')[-2000:]}" for p in logs)) from None


def _gone_within(pids, seconds: float) -> list[int]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.1)
    return [p for p in pids if _alive(p)]


def test_sigkill_of_the_ablate_takes_its_row_processes_with_it(tmp_path):
    out = tmp_path / "out"
    parent = _start(_plan(tmp_path, 100000), out, "--jobs", "2")
    try:
        _wait(lambda: _rows_pretraining(out), 60, "both rows to pretrain")
        rows = _row_procs(out)
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait()
        left = _gone_within(rows, 5.0)
        assert not left, f"row processes {[(p, rows[p]) for p in left]} outlived their ablate"
    finally:
        _cleanup(out, parent)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_sigterm_or_ctrl_c_to_the_ablate_stops_its_rows(tmp_path, sig):
    out = tmp_path / "out"
    parent = _start(_plan(tmp_path, 100000), out, "--jobs", "2")
    try:
        _wait(lambda: _rows_pretraining(out), 60, "both rows to pretrain")
        rows = _row_procs(out)
        parent.send_signal(sig)
        status = _exit_status(parent, tmp_path, out)
        assert status == (130 if sig == signal.SIGINT else 143), status
        left = _gone_within(rows, 5.0)
        assert not left, f"row processes {[(p, rows[p]) for p in left]} outlived their ablate"
        printed = (tmp_path / "out-parent.log").read_text()
        assert "== stopping 2 running seed(s)" in printed, printed
        assert "Traceback" not in printed and "KeyboardInterrupt" not in printed, printed
        if sig == signal.SIGINT:  # the last line is folnet's one line, how to go on
            assert printed.strip().splitlines()[-1].startswith("folnet ablate: "), printed
        for row in ROWS:  # each seed unwound (its lock released), none left holding its seed
            assert _row_holder_pid(out, row) is None
    finally:
        _cleanup(out, parent)


def test_a_seed_held_by_a_live_process_is_not_started_again_in_parallel(tmp_path):
    """Another process holds seed 0 of row "first" (as a seed process of an earlier, still
    running ablate would): the resumed ablate runs only "second" and says why "first" was
    left."""
    out = tmp_path / "out"
    plan = _plan(tmp_path, 3)
    with RunLock(out / "rows" / "first" / "seed_0", what="test seed"):
        proc = subprocess.run(
            [sys.executable, "-m", "folnet", "ablate", str(plan), "--out", str(out),
             "--jobs", "2", "--no-progress"], env=_env(), capture_output=True, text=True,
            timeout=120, stdin=subprocess.DEVNULL)
    printed = proc.stdout + proc.stderr
    assert f"row 'first' seed 0 is still running (pid {os.getpid()})" in printed, printed
    assert not (out / "rows" / "first" / "seed_0" / "pretrain").exists(), "the held seed ran"
    assert (out / "rows" / "second" / "result.json").is_file(), printed
    assert proc.returncode == 2, printed  # incomplete: the error names the running seed
    assert "still running" in proc.stderr.strip().splitlines()[-1]


def test_a_seed_held_by_a_live_process_is_not_started_again_in_sequence(tmp_path, capsys):
    out = tmp_path / "out"
    plan = _plan(tmp_path, 3)
    with RunLock(out / "rows" / "first" / "seed_0", what="test seed"):
        code = cli_main(["ablate", str(plan), "--out", str(out), "--rows", "first",
                         "--no-progress", "--no-report"])
    captured = capsys.readouterr()
    assert (f"row 'first' seed 0 is still running (pid {os.getpid()})"
            in captured.out + captured.err)
    assert not (out / "rows" / "first" / "seed_0" / "pretrain").exists(), "the held seed ran"
    assert code == 2


def test_row_log_keeps_its_lines_after_a_kill_and_a_resume(tmp_path):
    out = tmp_path / "out"
    plan = _plan(tmp_path, 100000)
    log = out / "first.log"
    first = _start(plan, out, "--jobs", "2")
    second = None
    try:
        _wait(lambda: _rows_pretraining(out, steps=0), 60, "both rows to start pretraining")
        old = set(_row_procs(out))
        os.kill(first.pid, signal.SIGKILL)
        first.wait()
        _gone_within(old, 5.0)  # (asserted by the test above; here only the log matters)
        before = log.read_bytes()
        assert b"pretraining j.a" in before
        second = _start(plan, out, "--jobs", "2")

        def resumed_row_logging() -> bool:
            new = set(_row_procs(out)) - old
            data = log.read_bytes()
            return bool(new) and (data.count(b"pretraining j.a") >= 2
                                  or not data.startswith(before))

        _wait(resumed_row_logging, 60, "the resumed row to log")
        time.sleep(1.0)  # let both writers (if the old row still lives) write some more
        second.send_signal(signal.SIGTERM)
        second.wait(timeout=20)
        data = log.read_bytes()
        nul = data.find(b"\0")
        assert nul < 0, f"NUL bytes in the row log from byte {nul} of {len(data)}"
        assert data.startswith(before), "the resume truncated the row log"
        assert b"started again" in data[len(before):]
        assert data.count(b"pretraining j.a") >= 2
    finally:
        _cleanup(out, first, *([second] if second else []))


def test_a_row_process_whose_ablate_is_already_gone_does_not_run(tmp_path):
    """The race the parent-death signal cannot cover: the ablate died before its row process
    armed the signal. The row process notices (its parent is no longer the ablate) and stops
    before touching the row."""
    gone = subprocess.Popen(["true"])
    gone.wait()
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "folnet", "ablate", str(_plan(tmp_path, 3)), "--out", str(out),
         "--rows", "first", "--no-progress", "--no-report", "--parent-pid", str(gone.pid)],
        env=_env(), capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"(pid {gone.pid}) is gone" in proc.stderr
    assert not (out / "rows").exists()


def test_jobs_run_every_seed_and_a_resume_redoes_only_the_unfinished_seed(tmp_path):
    out = tmp_path / "out"
    plan = tmp_path / "seeds.toml"
    plan.write_text(PLAN.replace("STEPS", "3").replace("seeds = 1", "seeds = 2"))

    def run() -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "folnet", "ablate", str(plan), "--out", str(out), "--jobs",
             "2", "--no-progress"], env=_env(), capture_output=True, text=True, timeout=300,
            stdin=subprocess.DEVNULL)

    proc = run()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for row in ROWS:
        assert all((out / "rows" / row / f"seed_{s}" / "result.json").is_file() for s in (0, 1))
    # the seeds are the units: both of "first" (D2 16, the costlier) start before any ends
    events = [line for line in proc.stdout.splitlines()
              if line.startswith("== started") or line.endswith(": done")]
    started = [e.split(" (pid")[0] for e in events if e.startswith("== started")]
    assert started == [f"== started row {r!r} seed {s}" for r in ROWS for s in (0, 1)], events
    assert events[1].startswith("== started row 'first' seed 1"), events
    kept = (out / "rows" / "second" / "seed_0" / "result.json").stat().st_mtime_ns
    (out / "rows" / "second" / "result.json").unlink()
    (out / "rows" / "second" / "seed_1" / "result.json").unlink()
    proc = run()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "[first] finished earlier" in proc.stdout
    assert "[second] seed 0 finished earlier" in proc.stdout  # not started: no process
    log = _read(out / "second.log").decode()
    resumed = log.rsplit("started again", 1)[1]
    assert resumed.startswith(" by ablate pid"), resumed[:200]
    assert "[second] seed 1 done in" in resumed and "seed 0 done in" not in resumed
    assert (out / "rows" / "second" / "seed_0" / "result.json").stat().st_mtime_ns == kept
    assert (out / "rows" / "second" / "result.json").is_file()


def test_the_costliest_rows_seeds_come_first(tmp_path):
    """`seed_units` orders the unfinished seeds by the row's forward FLOPs, stable within a row,
    and leaves out what is finished."""
    plan = load_plan(_plan(tmp_path, 3))
    cheap, costly = plan.rows[1], plan.rows[0]  # D2 8 and 16
    assert row_cost(plan, costly) > row_cost(plan, cheap) > 0
    reversed_plan = dataclasses.replace(plan, rows=(cheap, costly), seeds=2)
    out = tmp_path / "out"
    done = out / "rows" / cheap.slug / "seed_0" / "result.json"
    done.parent.mkdir(parents=True)
    done.write_text("{}")
    units = seed_units(reversed_plan, reversed_plan.rows, out)
    assert [(r.name, s) for r, s in units] == [("first", 0), ("first", 1), ("second", 1)]


def test_a_row_process_killed_mid_run_is_run_again_from_its_checkpoint(tmp_path):
    """The hostile case: SIGKILL to one row's process (the OOM killer, a preemption) made the
    whole ablate fail ("row 'first' seed 0 failed") though the row had checkpoints. Now the
    row runs again, resumes from its checkpoint, the ablate finishes, and the report says
    which seed was run again and why."""
    plan = tmp_path / "plan.toml"
    plan.write_text(tiny_plan("retry", """
[[rows]]
ops = "j.a"
name = "first"

[[rows]]
ops = "j.a"
D2 = 8
name = "second"
""", steps=40, save_every=4))
    out = tmp_path / "out"
    parent = _start(plan, out, "--jobs", "2")
    try:
        steps = out / "rows" / "first" / "seed_0" / "pretrain" / "log.jsonl"
        _wait(lambda: _lines(steps) >= 6 and "first" in _row_procs(out).values(), 240,
              "row 'first' to pass its first checkpoint")
        victim = next(pid for pid, row in _row_procs(out).items() if row == "first")
        os.kill(victim, signal.SIGKILL)
        assert parent.wait(timeout=600) == 0, _read(tmp_path / "out-parent.log").decode()
    finally:
        _cleanup(out, parent)
    said = _read(tmp_path / "out-parent.log").decode()
    assert "row 'first' seed 0: its process was ended by SIGKILL; running it again from its " \
           "checkpoints" in said
    assert "FAILED" not in said
    assert b"resumed from" in _read(out / "first.log")  # from its checkpoint, not afresh
    report = (out / "results.md").read_text()
    assert "Run again from their checkpoints after their process was killed (at most 2 " \
           "times each): row 'first' seed 0 (its process ended by SIGKILL)." in report
    assert (out / "rows" / "first" / "result.json").is_file()
