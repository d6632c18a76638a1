"""The testbed: real Debian hosts booted on this machine with systemd-nspawn (docs/testbed.md).

Each host: systemd as PID 1 (persistent journald), sshd on 127.0.0.1:<port_base + index> (the host network is
shared; local = index 0), its own machine-id, hostname and host key. Nothing is mocked: opsctl talks to them as
to any host. Mount sources and machine names carry ``kdtb-<tag>-`` (tag = hash of the state directory), which is
how `down` proves nothing of this testbed is left.

One module a job:

    rootfs.py       the machine-wide rootfs cache: built once per recipe, shared read-only by every testbed
    statedir.py     where one testbed keeps everything (its state directory), and each host's state.json
    hostdir.py      a host's directory: provisioned once (its own layer), mounted before each boot
    nspawn.py       boot and stop a host with systemd-nspawn, wait for its sshd, run a command inside it
    faults.py       fault injection for tests: power, sshd, a full disk
    clientfiles.py  what opsctl uses to reach the hosts: client key, known_hosts, inventory.yaml
    lifecycle.py    the Testbed: up, down, status, and the fault injections as its methods
    reset.py        a host put back to a clean state between tests
    prereqs.py, ports.py, procfs.py, localrun.py   root and tools; loopback ports; /proc; local commands

The names below are what the rest of the repository imports from ``opsctl.testbed``. It stands on floor 3
(docs/architecture.md, "Floors"): it may import ``errors``, ``release``, ``inventory`` and ``ssh`` (and the rest of
floors 0-2), never ``unit``, ``lock`` or anything above.
"""

from __future__ import annotations

from .clientfiles import inventory_text
from .lifecycle import HostStatus, Testbed, UpReport
from .localrun import PROGRESS_EVERY_S, Log, last_log_line
from .nspawn import BOOT_TIMEOUT_S, STOP_TIMEOUT_S
from .ports import DEFAULT_PORT_BASE, PORT_BASE_ENV, free_port_base
from .prereqs import REQUIRED_TOOLS, missing_tools, prerequisite_problem
from .reset import reset_host
from .rootfs import (
    CACHE_ENV,
    DEFAULT_CACHE_DIR,
    DEFAULT_MIRROR,
    MASKED_UNITS,
    MIRROR_ENV,
    PACKAGES,
    PIP_REQUIREMENTS,
    RECIPE_VERSION,
    SUITE,
    recipe_key,
)
from .statedir import DEFAULT_HOSTS, DEFAULT_STATE_DIR, DISK_MB, STATE_ENV, HostState, host_index, host_names

__all__ = [
    "BOOT_TIMEOUT_S",
    "CACHE_ENV",
    "DEFAULT_CACHE_DIR",
    "DEFAULT_HOSTS",
    "DEFAULT_MIRROR",
    "DEFAULT_PORT_BASE",
    "DEFAULT_STATE_DIR",
    "DISK_MB",
    "MASKED_UNITS",
    "MIRROR_ENV",
    "PACKAGES",
    "PIP_REQUIREMENTS",
    "PORT_BASE_ENV",
    "PROGRESS_EVERY_S",
    "RECIPE_VERSION",
    "REQUIRED_TOOLS",
    "STATE_ENV",
    "STOP_TIMEOUT_S",
    "SUITE",
    "HostState",
    "HostStatus",
    "Log",
    "Testbed",
    "UpReport",
    "boot",
    "default",
    "fill_disk",
    "free_disk",
    "free_port_base",
    "host_index",
    "host_names",
    "inventory_text",
    "last_log_line",
    "missing_tools",
    "poweroff",
    "prerequisite_problem",
    "recipe_key",
    "reset_host",
    "start_sshd",
    "stop_sshd",
]


# The default testbed ($OPSCTL_TESTBED_DIR or ./.testbed), for tests that inject a fault by host name.


def default() -> Testbed:
    return Testbed()


def poweroff(name: str) -> None:
    default().poweroff(name)


def boot(name: str) -> float:
    return default().boot(name)


def stop_sshd(name: str) -> None:
    default().stop_sshd(name)


def start_sshd(name: str) -> None:
    default().start_sshd(name)


def fill_disk(name: str, leave_mb: int = 0) -> None:
    default().fill_disk(name, leave_mb)


def free_disk(name: str) -> None:
    default().free_disk(name)
