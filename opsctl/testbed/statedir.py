"""Where one testbed keeps everything, and the per-host state it records. Paths only, plus reading and writing
state.json under the testbed's lock; what acts on a host lives in the modules beside this one.

    <state dir>/                   $OPSCTL_TESTBED_DIR, default ./.testbed
      id_ed25519[.pub]             the client key root logs in with on every host (clientfiles.py)
      known_hosts, inventory.yaml  written for opsctl (clientfiles.py)
      port_base                    the first port, recorded while hosts exist
      hosts/<name>/upper/          the host's own layer: machine-id, hostname, host key, sshd port, all it writes
      hosts/<name>/rootfs/         the host's "/": overlayfs of upper/ over the cached rootfs (hostdir.py)
      hosts/<name>/disk/           a size-limited tmpfs bound to /root in the host (hostdir.py, faults.py)
      hosts/<name>/state.json      HostState: the systemd-nspawn pid, port, boot time (nspawn.py)
      hosts/<name>/console.log     the host's console
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from ..errors import TestbedError
from ..inventory import Inventory
from ..inventory import load as load_inventory
from . import procfs
from .ports import DEFAULT_PORT_BASE, PORT_BASE_ENV
from .rootfs import CACHE_ENV, DEFAULT_CACHE_DIR, cached_rootfs

STATE_ENV = "OPSCTL_TESTBED_DIR"
DEFAULT_STATE_DIR = ".testbed"
DEFAULT_HOSTS = 2
DISK_MB = 1024  # size of each host's /root filesystem (tmpfs: only what is written uses memory)


def host_names(count: int) -> list[str]:
    """``local`` plus ``tb1..tbN``."""
    return ["local", *(f"tb{i}" for i in range(1, count + 1))]


def host_index(name: str) -> int:
    return 0 if name == "local" else int(name.removeprefix("tb"))


@dataclass
class HostState:
    name: str
    port: int
    machine: str
    pid: int | None = None  # systemd-nspawn
    init_pid: int | None = None  # the container's systemd (PID 1 inside)
    pidns: str | None = None  # the container's pid namespace (informational: the kernel reuses the ids)
    booted_at: float | None = None
    boot_s: float | None = None
    base: str | None = None  # the cached rootfs below this host's overlay


class StateDir:
    """One testbed's directories, names and recorded state: a state directory, a rootfs cache, a port range."""

    def __init__(
        self, state_dir: Path | str | None = None, *, cache_dir: Path | str | None = None, port_base: int | None = None
    ) -> None:
        self.state_dir = Path(state_dir or os.environ.get(STATE_ENV) or DEFAULT_STATE_DIR).absolute()
        self.cache_dir = Path(cache_dir or os.environ.get(CACHE_ENV) or DEFAULT_CACHE_DIR).absolute()
        # The base in use is recorded while hosts exist (it may have been moved past busy ports at the first up).
        recorded = self.port_base_file
        self.port_base = (
            int(recorded.read_text())
            if recorded.is_file()
            else (port_base or int(os.environ.get(PORT_BASE_ENV) or DEFAULT_PORT_BASE))
        )
        # Machine names must not clash between two testbeds on one machine.
        self.tag = hashlib.sha256(str(self.state_dir).encode()).hexdigest()[:6]

    # -- paths -----------------------------------------------------------------------------------------

    @property
    def client_key(self) -> Path:
        return self.state_dir / "id_ed25519"

    @property
    def known_hosts(self) -> Path:
        return self.state_dir / "known_hosts"

    @property
    def inventory_path(self) -> Path:
        return self.state_dir / "inventory.yaml"

    @property
    def port_base_file(self) -> Path:
        return self.state_dir / "port_base"

    @property
    def hosts_dir(self) -> Path:
        return self.state_dir / "hosts"

    def host_dir(self, name: str) -> Path:
        return self.hosts_dir / name

    def rootfs(self, name: str) -> Path:
        return self.host_dir(name) / "rootfs"

    def disk(self, name: str) -> Path:
        return self.host_dir(name) / "disk"

    def machine(self, name: str) -> str:
        return f"kdtb-{self.tag}-{name}"

    def cached_rootfs(self) -> Path:
        return cached_rootfs(self.cache_dir)

    def provisioned(self) -> list[str]:
        if not self.hosts_dir.is_dir():
            return []
        names = [d.name for d in self.hosts_dir.iterdir() if (d / "state.json").is_file()]
        return sorted(names, key=host_index)

    def inventory(self) -> Inventory:
        if not self.inventory_path.is_file():
            raise TestbedError(f"no testbed at {self.state_dir}: run `opsctl testbed up` first")
        return load_inventory(self.inventory_path)

    # -- state files -------------------------------------------------------------------------------------

    def state(self, name: str) -> HostState:
        path = self.host_dir(name) / "state.json"
        try:
            return HostState(**json.loads(path.read_text()))
        except (OSError, ValueError, TypeError) as e:
            raise TestbedError(
                f"testbed host {name!r} is not provisioned ({path}: {e}); run `opsctl testbed up`"
            ) from None

    def save_state(self, st: HostState) -> None:
        path = self.host_dir(st.name) / "state.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(st), indent=1))
        tmp.replace(path)

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """One testbed operation at a time (several test sessions may share a testbed)."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        with open(self.state_dir / ".lock", "w") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    def running(self, name: str) -> bool:
        st = self.state(name)
        return procfs.proc_alive(st.pid) and any(
            a.startswith("--machine=") and a.endswith(st.machine) for a in procfs.cmdline(st.pid or 0)
        )
