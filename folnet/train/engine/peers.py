"""Joining the other ranks across machines: the network interface gloo advertises, and a
connection that cannot be made ending the rank in one line instead of a hang.

Why the interface is chosen here: gloo tells its peers the address its host name resolves
to. On machines whose host name maps to 127.0.0.1 (a common /etc/hosts, every container of
one image, or several hosts sharing a name) each rank advertises its own loopback, and the
peers connect to themselves: rank 0 fails with "Gloo connectFullMesh failed ... remote=
[127.0.0.1]" and the others wait for a connection that never comes. Unless the user set
``GLOO_SOCKET_IFNAME``, folnet names the interface that carries this machine's route to
``MASTER_ADDR`` -- the one the other machines reach it through.

Why a watchdog: a rank left waiting for a peer blocks inside the C++ connect for the process
group's timeout (30 minutes by default), which also bounds every later collective, so it
cannot simply be shortened. The connection alone gets `connect_timeout` seconds
(``FOLNET_CONNECT_TIMEOUT``, default 300); past that the rank prints one line naming the
address it tried and the interface variables, and exits.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import socket
import struct
import sys
import threading
from collections.abc import Iterator

from folnet.errors import FolnetError

__all__ = ["CONNECT_TIMEOUT_ENV", "advertise_route_to_master", "connect_timeout",
           "connecting", "interface_with_address", "lost_peer", "unreachable_message"]

CONNECT_TIMEOUT_ENV = "FOLNET_CONNECT_TIMEOUT"
# what gloo, NCCL and the c10d store say when a peer process or machine went away
_LOST = ("Connection closed by peer", "Connection reset by peer", "Broken pipe",
         "NCCL communicator was aborted", "remote process exited or there was a network error")
DEFAULT_CONNECT_TIMEOUT = 300.0
_SIOCGIFADDR = 0x8915  # Linux: the IPv4 address of an interface


def connect_timeout() -> float:
    """Seconds a rank may take to connect to its peers (``FOLNET_CONNECT_TIMEOUT``)."""
    raw = os.environ.get(CONNECT_TIMEOUT_ENV, "")
    if raw == "":
        return DEFAULT_CONNECT_TIMEOUT
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise FolnetError(f"{CONNECT_TIMEOUT_ENV}={raw!r} must be a number of seconds > 0")
    return value


def _route_source(address: str) -> str | None:
    """This machine's IPv4 address on its route to ``address`` (no packet is sent)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((address, 9))
            return probe.getsockname()[0]
    except OSError:
        return None


def interface_with_address(address: str) -> str | None:
    """The name of the network interface holding IPv4 ``address`` (Linux), or None."""
    try:
        import fcntl  # POSIX only
        names = [name for _, name in socket.if_nameindex()]
    except (ImportError, OSError, AttributeError):
        return None
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as handle:
        for name in names:
            try:
                raw = fcntl.ioctl(handle.fileno(), _SIOCGIFADDR,
                                  struct.pack("256s", name[:15].encode()))
            except OSError:  # no IPv4 address on it
                continue
            if socket.inet_ntoa(raw[20:24]) == address:
                return name
    return None


def advertise_route_to_master(master: str | None) -> str | None:
    """Set ``GLOO_SOCKET_IFNAME`` to the interface routing to ``master`` when the user did
    not and it is not loopback; returns the interface name set, or None."""
    if not master or os.environ.get("GLOO_SOCKET_IFNAME"):
        return None
    source = _route_source(master)
    if source is None or ipaddress.ip_address(source).is_loopback:
        return None
    name = interface_with_address(source)
    if name is not None:
        os.environ["GLOO_SOCKET_IFNAME"] = name
    return name


#: What torchrun reads to give its workers a store of their own instead of its rendezvous store.
UNSHARED_STORE_ENV = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"


def shared_store_warning() -> str | None:
    """The warning for an elastic run (``--max-restarts`` > 0) whose workers share torchrun's
    rendezvous store, else None. Why: each agent counts its own restarts, and the shared store
    keys a run's addresses by that count, so after a restart one machine's ranks can read the
    addresses of the attempt before and fail to connect (pytorch/pytorch#135712); a store per
    attempt avoids it."""
    shared = os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"
    try:
        restarts = int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0"))
    except ValueError:
        restarts = 0
    if not shared or restarts <= 0:
        return None
    return (f"torchrun --max-restarts {restarts} with its rendezvous store shared: a restart "
            f"can pair ranks of different attempts (pytorch/pytorch#135712); set "
            f"{UNSHARED_STORE_ENV}=1 for torchrun on every machine")


def unreachable_message(rank: int, cause: str) -> str:
    """One line: which rank could not reach its peers, the address it tried, what to set."""
    master = f"{os.environ.get('MASTER_ADDR', '?')}:{os.environ.get('MASTER_PORT', '?')}"
    chosen = {k: os.environ[k] for k in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")
              if os.environ.get(k)}
    said = ", ".join(f"{k}={v}" for k, v in chosen.items()) or "neither set"
    return (f"rank {rank} could not connect to its peers through MASTER_ADDR:PORT {master} "
            f"({cause}; {said}): set GLOO_SOCKET_IFNAME (gloo) or NCCL_SOCKET_IFNAME (NCCL) "
            f"on every machine to the interface the other machines reach it through")


@contextlib.contextmanager
def connecting(rank: int, seconds: float) -> Iterator[None]:
    """Run the block (joining the process group, then a first barrier) under a watchdog:
    past ``seconds`` the rank prints `unreachable_message` and exits with status 2 (a
    command's error) -- the block is stuck in C++, which no exception reaches. A failure
    inside the block becomes a `FolnetError` with the same message."""
    done = threading.Event()

    def watch() -> None:
        if not done.wait(seconds):
            print(f"folnet: error: {unreachable_message(rank, f'no answer in {seconds:g} s')}",
                  file=sys.stderr, flush=True)
            os._exit(2)  # the status folnet's commands give an error

    threading.Thread(target=watch, name="folnet-connect-watchdog", daemon=True).start()
    try:
        yield
    except RuntimeError as exc:
        cause = " ".join(str(exc).split())[-300:]
        raise FolnetError(unreachable_message(rank, cause)) from None
    finally:
        done.set()


def lost_peer(exc: BaseException, rank: int) -> FolnetError | None:
    """The one-line error for a collective that failed because a peer died (its process or
    machine: gloo sees the socket close at once), or None for any other failure."""
    text = " ".join(str(exc).split())
    if not isinstance(exc, RuntimeError) or not any(sign in text for sign in _LOST):
        return None
    cause = text.split("] ", 1)[-1].split(". This is typically", 1)[0][:200]
    return FolnetError(f"rank {rank} lost a peer of the run ({cause}): a process or machine "
                       f"of it ended; the same command with --resume auto continues from the "
                       f"last checkpoint (torchrun --max-restarts does so by itself)")
