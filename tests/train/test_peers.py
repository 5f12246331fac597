"""folnet.train.engine.peers on its own: the connect timeout, the interface lookup, the
one-line errors, and the watchdog that ends a rank stuck connecting (tests/train/
test_multinode.py runs them across two hosts)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest

from folnet.errors import FolnetError
from folnet.train.engine import peers


def test_connect_timeout_reads_the_variable_and_names_a_bad_value(monkeypatch):
    monkeypatch.delenv(peers.CONNECT_TIMEOUT_ENV, raising=False)
    assert peers.connect_timeout() == 300.0
    monkeypatch.setenv(peers.CONNECT_TIMEOUT_ENV, "12.5")
    assert peers.connect_timeout() == 12.5
    for bad in ("0", "-3", "soon", "nan"):
        monkeypatch.setenv(peers.CONNECT_TIMEOUT_ENV, bad)
        with pytest.raises(FolnetError, match=f"FOLNET_CONNECT_TIMEOUT='{bad}' must be a "
                                              f"number of seconds > 0"):
            peers.connect_timeout()


def test_the_interface_of_an_address_and_loopback_left_alone(monkeypatch):
    if not hasattr(socket, "if_nameindex"):
        pytest.skip("socket.if_nameindex is Linux/Unix only")
    assert peers.interface_with_address("127.0.0.1") == "lo"
    assert peers.interface_with_address("192.0.2.123") is None  # TEST-NET-1: nobody's
    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    assert peers.advertise_route_to_master("127.0.0.1") is None  # one machine: gloo's own
    assert "GLOO_SOCKET_IFNAME" not in os.environ
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "eth7")  # the user's choice is kept
    assert peers.advertise_route_to_master("192.0.2.1") is None


def test_lost_peer_is_told_from_other_failures():
    gloo = RuntimeError("[../gloo/transport/tcp/pair.cc:553] Connection closed by peer "
                        "[10.0.0.2]:26773. This is typically caused by a remote worker "
                        "crashing. Check the logs")
    lost = peers.lost_peer(gloo, 0)
    assert isinstance(lost, FolnetError)
    assert str(lost).startswith("rank 0 lost a peer of the run (Connection closed by peer "
                                "[10.0.0.2]:26773)")
    assert "--resume auto" in str(lost)
    assert peers.lost_peer(RuntimeError("CUDA out of memory"), 0) is None
    assert peers.lost_peer(ValueError("Connection closed by peer"), 0) is None


def test_a_failed_connection_is_one_line_naming_the_address(monkeypatch):
    monkeypatch.setenv("MASTER_ADDR", "10.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29500")
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "lo")
    with pytest.raises(FolnetError) as caught:
        with peers.connecting(3, 60):
            raise RuntimeError("Gloo connectFullMesh failed with\n timed out connecting: "
                               "remote=[127.0.0.1]:30115")
    text = str(caught.value)
    assert "\n" not in text
    assert text.startswith("rank 3 could not connect to its peers through MASTER_ADDR:PORT "
                           "10.0.0.1:29500 (Gloo connectFullMesh failed with timed out")
    assert "GLOO_SOCKET_IFNAME=lo" in text and "NCCL_SOCKET_IFNAME" in text


def test_the_watchdog_ends_a_rank_stuck_connecting():
    """A block that never returns (as a C++ connect waiting for a peer): past the timeout the
    process prints the one line and exits 2, where it would have waited on."""
    code = ("import time; from folnet.train.engine.peers import connecting\n"
            "with connecting(1, 0.5):\n    time.sleep(60)\n")
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, env={**os.environ,
                                           "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"})
    assert done.returncode == 2, done.stderr
    assert time.monotonic() - started < 30
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("folnet: error: rank 1 could not connect to its peers through "
                               "MASTER_ADDR:PORT 10.0.0.1:29500 (no answer in 0.5 s;")


@pytest.mark.parametrize(("env", "warned"), [
    ({"TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_MAX_RESTARTS": "3"}, True),
    ({"TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_MAX_RESTARTS": "0"}, False),
    ({"TORCHELASTIC_USE_AGENT_STORE": "False", "TORCHELASTIC_MAX_RESTARTS": "3"}, False),
    ({}, False),
])
def test_an_elastic_run_on_torchruns_shared_store_is_warned(monkeypatch, env, warned):
    for key in ("TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_MAX_RESTARTS"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    text = peers.shared_store_warning()
    assert (text is not None) == warned
    if warned:
        assert "--max-restarts 3" in text and "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1" in text
