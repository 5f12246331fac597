"""Two test hosts on one machine: Linux network namespaces joined by a veth pair, each with
its own address, and (on request) its own host name resolving to the right address on both.

`TwoHosts` needs root and iproute2; `two_hosts_or_skip` says why when they are missing.
Everything it makes -- the namespaces, the veth pair, the /etc/netns/NAME/hosts files that
``ip netns exec`` mounts over /etc/hosts -- is removed by `TwoHosts.close`, and every process
still running in a namespace is killed first.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

NAMES = ("node0", "node1")  # the host names `TwoHosts.start(..., named=True)` gives


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


class TwoHosts:
    """Namespaces ``folnet-PID-0`` and ``-1`` at 10.231.S.1 and 10.231.S.2 (S from the pid,
    so two test sessions on one machine do not share a subnet)."""

    def __init__(self) -> None:
        tag = os.getpid() % 100000
        subnet = 1 + os.getpid() % 250
        self.namespaces = [f"folnet-{tag}-{i}" for i in range(2)]
        self.addresses = [f"10.231.{subnet}.{i + 1}" for i in range(2)]
        self.links = [f"fnv{tag}a", f"fnv{tag}b"]
        self.procs: list[subprocess.Popen] = []
        try:
            for ns in self.namespaces:
                _ip("netns", "add", ns)
            _ip("link", "add", self.links[0], "type", "veth", "peer", "name", self.links[1])
            for ns, link, address in zip(self.namespaces, self.links, self.addresses,
                                         strict=True):
                _ip("link", "set", link, "netns", ns)
                _ip("-n", ns, "addr", "add", f"{address}/24", "dev", link)
                _ip("-n", ns, "link", "set", link, "up")
                _ip("-n", ns, "link", "set", "lo", "up")
                hosts = Path("/etc/netns") / ns / "hosts"
                hosts.parent.mkdir(parents=True, exist_ok=True)
                hosts.write_text("127.0.0.1 localhost\n" + "".join(
                    f"{a} {n}\n" for a, n in zip(self.addresses, NAMES, strict=True)))
        except BaseException:
            self.close()
            raise

    def start(self, host: int, command: Sequence[str], env: Mapping[str, str], log: Path,
              *, named: bool = False) -> subprocess.Popen:
        """``command`` in host ``host``'s namespace with exactly ``env``, output to ``log``.
        ``named``: in a UTS namespace of its own whose host name is ``NAMES[host]``;
        otherwise the machine's own host name, the same on both hosts (resolving to
        127.0.0.1 here, as on many machines)."""
        inner = list(command)
        if named:
            inner = ["unshare", "--uts", "sh", "-c", f'hostname {NAMES[host]} && exec "$@"',
                     "sh", *inner]
        with open(log, "wb") as handle:
            proc = subprocess.Popen(["ip", "netns", "exec", self.namespaces[host], *inner],
                                    env=dict(env), stdout=handle, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
        self.procs.append(proc)
        return proc

    def kill(self, host: int) -> None:
        """SIGKILL every process in host ``host`` (the machine lost)."""
        listed = subprocess.run(["ip", "netns", "pids", self.namespaces[host]],
                                capture_output=True, text=True, timeout=30).stdout.split()
        for pid in listed:
            try:
                os.kill(int(pid), signal.SIGKILL)
            except ProcessLookupError:
                pass

    def close(self) -> None:
        for host in range(2):
            if Path("/run/netns", self.namespaces[host]).exists():
                self.kill(host)
        for proc in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
        for ns in self.namespaces:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)
            shutil.rmtree(Path("/etc/netns") / ns, ignore_errors=True)


def two_hosts_or_skip() -> TwoHosts:
    """`TwoHosts`, or a skip that says what this machine lacks for them."""
    missing = [tool for tool in ("ip", "unshare") if shutil.which(tool) is None]
    if missing:
        pytest.skip(f"two test hosts need {' and '.join(missing)} (iproute2, util-linux)")
    if os.geteuid() != 0:
        pytest.skip("two test hosts need root (ip netns add)")
    return TwoHosts()
