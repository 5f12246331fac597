"""The run-directory lock: exclusive, refused at once with the holder named, gone with its
holder however the holder dies."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

from folnet.errors import FolnetError
from folnet.train.engine.lock import LOCK_NAME, RunLock, lock_holder


def test_second_lock_is_refused_naming_the_holder(tmp_path):
    out = tmp_path / "run"
    with RunLock(out, what="pretraining run") as first:
        assert first.held and (out / LOCK_NAME).is_file()
        with pytest.raises(FolnetError, match=r"'.*run' is in use by another pretraining run: "
                                              r"pid \d+ on .* since .*; wait for it"):
            RunLock(out, what="pretraining run").acquire()
    assert lock_holder(out) is None
    with RunLock(out) as again:  # released: free for the next run
        assert again.held


def test_lock_of_a_killed_process_is_free(tmp_path):
    out = tmp_path / "run"
    code = ("import sys, time; from folnet.train.engine.lock import RunLock; "
            f"RunLock({str(out)!r}).acquire(); print('held', flush=True); time.sleep(60)")
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        info = lock_holder(out)
        assert info is not None and info["pid"] == holder.pid
        with pytest.raises(FolnetError, match=rf"pid {holder.pid} on "):
            RunLock(out).acquire()
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    deadline = time.monotonic() + 10
    while lock_holder(out) is not None:  # the kernel drops the lock with the process
        assert time.monotonic() < deadline
        time.sleep(0.01)
    with RunLock(out) as lock:
        assert lock.held
