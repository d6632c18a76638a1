"""What the testbed needs on this machine (root, the tools of REQUIRED_TOOLS) and the sentence that says how to
get what is missing."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable

from ..errors import TestbedError

# Tool -> Debian package that provides it.
REQUIRED_TOOLS = {
    "systemd-nspawn": "systemd-container",
    "debootstrap": "debootstrap",
    "rsync": "rsync",
    "ssh": "openssh-client",
    "ssh-keygen": "openssh-client",
    "nsenter": "util-linux",
}


def missing_tools(which: Callable[[str], str | None] = shutil.which) -> dict[str, str]:
    """Tools not on PATH -> the Debian package to install."""
    return {tool: pkg for tool, pkg in REQUIRED_TOOLS.items() if which(tool) is None}


def prerequisite_problem(euid: int, missing: dict[str, str]) -> str | None:
    """What stops the testbed from running here, as an actionable sentence; None when nothing does."""
    problems = []
    if euid != 0:
        how = "as root" if shutil.which("sudo") is None else "as root (e.g. sudo .venv/bin/opsctl testbed up)"
        problems.append(f"the testbed needs root (systemd-nspawn, debootstrap, mounts): run it {how}")
    if missing:
        pkgs = " ".join(sorted(set(missing.values())))
        problems.append(f"missing {', '.join(sorted(missing))}: apt-get install -y {pkgs}")
    return "; ".join(problems) or None


def check_prerequisites() -> None:
    problem = prerequisite_problem(os.geteuid(), missing_tools())
    if problem:
        raise TestbedError(problem)
