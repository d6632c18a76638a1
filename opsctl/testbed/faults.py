"""Fault injection for tests, all of it real: pull a host's plug or shut it down and boot it again, stop and
start its sshd, fill its /root disk and free it again."""

from __future__ import annotations

import os
import time

from ..errors import TestbedError
from . import nspawn
from .localrun import run
from .ports import sshd_answers
from .statedir import DISK_MB, StateDir


def poweroff(tb: StateDir, name: str) -> None:
    """Pull the plug: SIGKILL the host's PID 1. Its /root disk survives, its volatile state does not."""
    with tb.locked():
        nspawn.stop(tb, name, hard=True)


def shutdown(tb: StateDir, name: str) -> None:
    """An orderly poweroff (systemd stops its units)."""
    with tb.locked():
        nspawn.stop(tb, name, hard=False)


def boot(tb: StateDir, name: str) -> float:
    """Boot a stopped host again (same disk, same keys); waits for sshd. Returns boot seconds."""
    with tb.locked():
        return nspawn.start(tb, name)


def stop_sshd(tb: StateDir, name: str) -> None:
    """Stop the host's sshd: new connections are refused, sessions already open go on."""
    nspawn.nsenter(tb, name, ["systemctl", "stop", "ssh.service"])


def start_sshd(tb: StateDir, name: str) -> None:
    nspawn.nsenter(tb, name, ["systemctl", "start", "ssh.service"])
    port = tb.state(name).port
    deadline = time.monotonic() + 20
    while not sshd_answers(port) and time.monotonic() < deadline:
        time.sleep(0.1)


def fill_disk(tb: StateDir, name: str, leave_mb: int = 0) -> None:
    """Make the host's /root filesystem (the release root's) full: its tmpfs shrinks to what is used."""
    disk = tb.disk(name)
    if not os.path.ismount(disk):
        raise TestbedError(f"{name}'s disk is not mounted (is the host up?)")
    vfs = os.statvfs(disk)
    used = (vfs.f_blocks - vfs.f_bfree) * vfs.f_frsize
    size_kb = max(used // 1024 + leave_mb * 1024, 4)
    run(["mount", "-o", f"remount,size={size_kb}k", str(disk)], what=f"shrink of {name}'s disk")


def free_disk(tb: StateDir, name: str) -> None:
    """Undo fill_disk: the disk gets its full size back."""
    disk = tb.disk(name)
    if os.path.ismount(disk):
        run(["mount", "-o", f"remount,size={DISK_MB}m", str(disk)], what=f"resize of {name}'s disk")
