"""What /proc says about the testbed's processes: alive or not, their command lines, children, pid namespaces,
the container's PID 1, and what each sees as "/". Read-only: nothing here signals or changes a process."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path


def proc_alive(pid: int | None) -> bool:
    if not pid:
        return False
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)  # reap it if it is our child and has exited
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def children(pid: int) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[1]) == pid:
            out.append(int(d.name))
    return out


def pidns(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return None


def container_init(nspawn_pid: int) -> int | None:
    """The container's PID 1: the child of systemd-nspawn that lives in a pid namespace of its own (nspawn's
    short-lived helper children share ours)."""
    ours = pidns(os.getpid())
    for kid in children(nspawn_pid):
        ns = pidns(kid)
        if ns is not None and ns != ours:
            return kid
    return None


def root_mount(pid: int) -> tuple[str, str] | None:
    """What a process sees as "/": (path inside its filesystem, mount source), from its mountinfo."""
    try:
        for line in Path(f"/proc/{pid}/mountinfo").read_text().splitlines():
            fields = line.split()
            if fields[4] == "/":
                after_dash = fields[fields.index("-") + 1 :]
                return fields[3], after_dash[1] if len(after_dash) > 1 else ""
    except (OSError, IndexError, ValueError):
        return None
    return None
