"""The rendezvous port a local run picks stays free until torchrun binds it: it is not one the kernel
hands to outgoing connections, and it is not one something already listens on."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

import hpcjob.backends.local as local
from hpcjob.backends.local import KEPT_CLEAR, free_port


def test_a_picked_port_is_below_the_ephemeral_range_and_binds_on_every_address() -> None:
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    for _ in range(20):
        port = free_port()
        assert local.PICKED_PORTS_FROM <= port < low and port not in KEPT_CLEAR
        with socket.socket() as sock:  # as torch's TCPStore binds it
            sock.bind(("", port))


def test_a_port_something_listens_on_is_passed_over(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as held, socket.socket() as on_loopback:
        held.bind(("", 0))
        held.listen()
        on_loopback.bind(("127.0.0.1", 0))
        on_loopback.listen()
        taken = [held.getsockname()[1], on_loopback.getsockname()[1]]
        free = free_port()
        monkeypatch.setattr(local.random, "sample", lambda *_a, **_k: [*taken, KEPT_CLEAR[0], free])
        assert free_port() == free
