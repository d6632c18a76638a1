"""The testbed's loopback ports: which are taken, where a range of free ones starts, which answer as sshd. The
hosts share this machine's network, so each host's sshd listens on a port of its own on 127.0.0.1."""

from __future__ import annotations

import socket
from collections.abc import Callable

from ..errors import TestbedError

PORT_BASE_ENV = "OPSCTL_TESTBED_PORT_BASE"
DEFAULT_PORT_BASE = 2220


def free_port_base(start: int, width: int, in_use: Callable[[int], bool], step: int = 10, tries: int = 100) -> int:
    """The first base from ``start`` (in steps) whose ``width`` ports are all free."""
    for base in range(start, start + step * tries, step):
        if base + width <= 65535 and not any(in_use(p) for p in range(base, base + width)):
            return base
    raise TestbedError(f"no {width} free loopback ports from {start} on; set {PORT_BASE_ENV}")


def port_in_use(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def sshd_answers(port: int, timeout: float = 1.0) -> bool:
    """True when something on 127.0.0.1:port sends an SSH banner."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            s.settimeout(timeout)
            return s.recv(64).startswith(b"SSH-")
    except OSError:
        return False
