"""Child processes that cannot outlive their parent, and a parent that stops them cleanly.

A parent that runs work in child processes (``folnet ablate --jobs N``) must not leave them
running when it goes away, or a rerun starts the same work beside them. Two mechanisms, because
neither covers every way a parent ends:

- the *parent-death signal* (Linux ``prctl(PR_SET_PDEATHSIG)``): the kernel sends the child
  SIGKILL when its parent dies, however it dies -- SIGKILL and crashes included, where the
  parent runs no code at all. The child arms it itself at start-up (`die_with_parent`), not in
  a ``preexec_fn``: code between fork and exec is unsafe in a parent with threads (torch
  starts some), and the child's own start-up is just as good once it checks that its parent is
  still the one that started it (the parent may have died before the signal was armed, and
  then the child has already been re-parented).
- a *session of its own* per child (``start_new_session=True``): a terminal's Ctrl-C reaches
  only the parent, which then stops its children in order (`stop_processes`: SIGTERM to each
  child's process group, grandchildren included, and SIGKILL after a grace period) instead of
  every process unwinding at once; and the parent can signal a whole child group at once.
  `sigterm_exits` turns SIGTERM into `SystemExit` so that the parent's and the children's
  ``finally`` blocks (locks, stopping children) run.

Limits: the parent-death signal is Linux only (elsewhere a child outlives a parent killed with
SIGKILL; an orderly stop still works), it is delivered when the *thread* that started the child
ends (start children from the main thread), and it reaches only the direct child: a
grandchild is stopped by the group signal of an orderly stop, or must watch its own parent
(torch's DataLoader workers do).
"""

from __future__ import annotations

import ctypes
import functools
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from types import FrameType

from folnet.errors import FolnetError

__all__ = ["die_with_parent", "sigterm_exits", "stop_processes"]

PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>


@functools.lru_cache(maxsize=1)
def _prctl() -> Callable[..., int] | None:
    """libc's ``prctl``, or None where there is none (not Linux, no libc symbols)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


def die_with_parent(parent_pid: int) -> bool:
    """Arm SIGKILL on the death of the parent process ``parent_pid`` (the pid that started this
    process); returns whether it could be armed (Linux only).

    Raises `FolnetError` when that parent is already gone: this process has then been
    re-parented (``getppid()`` differs) and would otherwise run as an orphan -- the race where
    the parent died between starting this process and the signal taking effect.
    """
    prctl = _prctl()
    armed = prctl is not None and prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) == 0
    if os.getppid() != parent_pid:
        raise FolnetError(f"the process that started this one (pid {parent_pid}) is gone "
                          f"(parent now pid {os.getppid()}); not running without it")
    return armed


@contextmanager
def sigterm_exits() -> Iterator[None]:
    """Inside, SIGTERM raises ``SystemExit(143)`` (128 + 15, what a shell reports for death by
    SIGTERM) instead of ending the process on the spot, so ``finally`` blocks and context
    managers run: locks are released and child processes stopped. Does nothing outside the
    main thread (where Python cannot handle signals) or when SIGTERM is ignored."""

    def handler(signum: int, frame: FrameType | None) -> None:
        raise SystemExit(128 + signum)

    try:
        if signal.getsignal(signal.SIGTERM) is signal.SIG_IGN:
            previous = None
        else:
            previous = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread
        previous = None
    try:
        yield
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    """``sig`` to the process group led by ``proc`` (started with ``start_new_session``)."""
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass  # the group is gone already


def stop_processes(procs: Sequence[subprocess.Popen], *, grace: float = 10.0) -> None:
    """Stop children each started with ``start_new_session=True``: SIGTERM to their process
    groups, up to ``grace`` seconds for them to exit, then SIGKILL to the groups (which also
    ends any straggling grandchild); every child is reaped before returning."""
    for proc in procs:
        if proc.poll() is None:
            _signal_group(proc, signal.SIGTERM)
    deadline = time.monotonic() + grace
    for proc in procs:
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    for proc in procs:
        _signal_group(proc, signal.SIGKILL)
        proc.wait()
