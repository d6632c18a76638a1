"""The Testbed: `up` (build the rootfs once, provision, boot), `down` (stop, unmount, remove, and prove nothing is
left), `status`; and, for tests, the fault injections of faults.py as methods."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from ..errors import TestbedError
from . import clientfiles, faults, hostdir, nspawn, prereqs, procfs, rootfs
from .localrun import Log, quiet
from .ports import free_port_base, port_in_use, sshd_answers
from .statedir import DEFAULT_HOSTS, STATE_ENV, StateDir, host_names


@dataclass(frozen=True)
class HostStatus:
    name: str
    port: int
    state: str  # running | stopped | absent
    sshd: bool
    pid: int | None
    boot_s: float | None
    disk_free_mb: int | None


@dataclass(frozen=True)
class UpReport:
    hosts: list[HostStatus]
    inventory: Path
    rootfs_build_s: float | None  # None: the cached rootfs was used
    provision_s: float
    boot_s: float  # wall time from the first boot to the last sshd answering
    total_s: float


class Testbed(StateDir):
    """One testbed: a state directory, a rootfs cache and a port range."""

    __test__ = False  # not a pytest test class

    @staticmethod
    def check_prerequisites() -> None:
        prereqs.check_prerequisites()

    def ensure_rootfs(self, log: Log = quiet) -> tuple[Path, float | None]:
        """The cached rootfs, built first if missing. Returns (path, build seconds or None when cached)."""
        return rootfs.ensure_rootfs(self.cache_dir, log)

    def up(self, count: int = DEFAULT_HOSTS, log: Log = quiet) -> UpReport:
        """Build (once) and boot ``local`` + tb1..tbN. Hosts already running are kept as they are."""
        if count < 0 or count > 50:
            raise TestbedError(f"host count {count} out of range 0..50")
        self.check_prerequisites()
        if any(c in str(self.state_dir) for c in " ;$`'\"\\"):
            raise TestbedError(
                f"testbed directory {self.state_dir} has spaces or shell characters; pick another with {STATE_ENV}"
            )
        total = time.monotonic()
        with self.locked():
            base, build_s = self.ensure_rootfs(log)
            how = f"built in {build_s:.0f}s" if build_s is not None else "cached"
            log(f"rootfs: {base} ({how})")
            clientfiles.ensure_client_key(self)
            names = host_names(count)
            if not self.provisioned():
                first_port = free_port_base(self.port_base, count + 1, port_in_use)
                if first_port != self.port_base:
                    log(f"ports {self.port_base}.. are in use here: this testbed uses {first_port}..")
                self.port_base = first_port
                self.port_base_file.write_text(f"{first_port}\n")
            t = time.monotonic()
            for name in names:
                if name not in self.provisioned():
                    log(f"provisioning {name}")
                    hostdir.provision(self, name, base)
            provision_s = time.monotonic() - t
            clientfiles.write_known_hosts_and_inventory(self)
            t = time.monotonic()
            for name in self.provisioned():
                if not self.running(name):
                    secs = nspawn.start(self, name)
                    log(f"{name}: sshd answering on 127.0.0.1:{self.state(name).port} after {secs:.1f}s")
            boot_s = time.monotonic() - t
        return UpReport(
            hosts=self.status(),
            inventory=self.inventory_path,
            rootfs_build_s=build_s,
            provision_s=provision_s,
            boot_s=boot_s,
            total_s=time.monotonic() - total,
        )

    def down(self, log: Log = quiet) -> list[str]:
        """Stop every host, unmount its layers, remove its directory (the rootfs cache stays). Returns what was
        left over and had to be killed or unmounted; raises if anything is still there afterwards."""
        with self.locked():
            names = self.provisioned()
            for name in names:
                t = time.monotonic()
                nspawn.stop(self, name, hard=False)
                log(f"{name}: stopped in {time.monotonic() - t:.1f}s")
            stray = self.leftover_processes()
            for item in stray:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(item.split()[1]), signal.SIGKILL)
            if stray:
                time.sleep(0.5)
            for name in names:
                hostdir.umount_all(self, name)
            stray += self.leftover_mounts()
            for mountpoint in self.leftover_mounts():
                subprocess.run(["umount", "-l", mountpoint.split()[1]], check=False, stdin=subprocess.DEVNULL)
            for name in names:
                shutil.rmtree(self.host_dir(name))
            clientfiles.remove(self)
            self.port_base_file.unlink(missing_ok=True)
            for tmp in self.hosts_dir.glob(".*.provisioning") if self.hosts_dir.is_dir() else ():
                shutil.rmtree(tmp, ignore_errors=True)
            after = self.leftover_processes() + self.leftover_mounts()
            if after:
                raise TestbedError(f"testbed down left these behind: {'; '.join(after)}")
            return stray

    def leftover_processes(self) -> list[str]:
        """Processes of this testbed: its systemd-nspawns and anything whose "/" is one of its hosts' overlays.
        (Not by pid namespace id: the kernel reuses those, and another testbed's host could match.)"""
        found = []
        marker = f"kdtb-{self.tag}-"
        for d in Path("/proc").iterdir():
            if not d.name.isdigit() or int(d.name) == os.getpid() or not procfs.proc_alive(int(d.name)):
                continue
            args = procfs.cmdline(int(d.name))
            root = procfs.root_mount(int(d.name))
            if any(a.startswith(f"--machine={marker}") for a in args) or (root and root[1].startswith(marker)):
                found.append(f"process {d.name} {' '.join(args)[:120]}")
        return found

    def leftover_mounts(self) -> list[str]:
        prefix = f"{self.state_dir}/"
        mounts = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()]
        return [f"mount {m}" for m in mounts if m.startswith(prefix)]

    def status(self) -> list[HostStatus]:
        out = []
        for name in self.provisioned():
            st = self.state(name)
            running = self.running(name)
            free = None
            if os.path.ismount(self.disk(name)):
                vfs = os.statvfs(self.disk(name))
                free = vfs.f_bavail * vfs.f_frsize // (1024 * 1024)
            out.append(
                HostStatus(
                    name=name,
                    port=st.port,
                    state="running" if running else "stopped",
                    sshd=running and sshd_answers(st.port),
                    pid=st.pid if running else None,
                    boot_s=st.boot_s if running else None,
                    disk_free_mb=free,
                )
            )
        return out

    # -- fault injection (tests): faults.py, on this testbed ------------------------------------------------

    def poweroff(self, name: str) -> None:
        faults.poweroff(self, name)

    def shutdown(self, name: str) -> None:
        faults.shutdown(self, name)

    def boot(self, name: str) -> float:
        return faults.boot(self, name)

    def stop_sshd(self, name: str) -> None:
        faults.stop_sshd(self, name)

    def start_sshd(self, name: str) -> None:
        faults.start_sshd(self, name)

    def fill_disk(self, name: str, leave_mb: int = 0) -> None:
        faults.fill_disk(self, name, leave_mb)

    def free_disk(self, name: str) -> None:
        faults.free_disk(self, name)
