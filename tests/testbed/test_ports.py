"""opsctl/testbed/ports.py: the choice of a free port range, and what counts as an sshd answering (real
listeners on 127.0.0.1)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest

from opsctl import errors
from opsctl.testbed.ports import free_port_base, port_in_use, sshd_answers


def test_free_port_base_skips_busy_ranges() -> None:
    busy = {2221, 2232}
    assert free_port_base(2220, 3, busy.__contains__) == 2240
    assert free_port_base(2220, 1, busy.__contains__) == 2220
    with pytest.raises(errors.TestbedError, match="OPSCTL_TESTBED_PORT_BASE"):
        free_port_base(2220, 3, lambda p: True, tries=3)


def _listener(greeting: bytes) -> Iterator[int]:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:  # closed at the end of the test
                return
            with conn:
                conn.sendall(greeting)

    threading.Thread(target=serve, daemon=True).start()
    yield server.getsockname()[1]
    server.close()


@pytest.fixture
def ssh_port() -> Iterator[int]:
    yield from _listener(b"SSH-2.0-OpenSSH_9.2p1 Debian\r\n")


@pytest.fixture
def http_port() -> Iterator[int]:
    yield from _listener(b"HTTP/1.1 400 Bad Request\r\n\r\n")


def test_only_an_ssh_banner_counts_as_sshd(ssh_port: int, http_port: int) -> None:
    assert port_in_use(ssh_port) and sshd_answers(ssh_port)
    assert port_in_use(http_port) and not sshd_answers(http_port)  # taken, but not by an sshd


def test_a_closed_port_is_free_and_no_sshd() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert not port_in_use(port) and not sshd_answers(port, timeout=0.2)
