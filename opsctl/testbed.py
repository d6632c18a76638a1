"""The testbed: real Debian hosts booted on this machine with systemd-nspawn (docs/testbed.md).

The rootfs cache is machine-wide ($OPSCTL_TESTBED_CACHE, default /var/cache/opsctl-testbed), shared by every
testbed and checkout on the machine:

    rootfs-<key>/              debootstrap'ed bookworm + CPU torch/numpy, built once (key = hash of the recipe);
                               built in rootfs-<key>.building-<pid>/ and renamed when complete, so a half build is
                               never used; rootfs-<key>.build.log beside it

Layout of the state directory ($OPSCTL_TESTBED_DIR, default ./.testbed):

    id_ed25519[.pub]           the client key root logs in with on every host
    known_hosts                every host's own (generated) host key, so strict checking works from the start
    inventory.yaml             hosts local, tb1..tbN; groups testbed (all) and fleet (tb1..tbN)
    hosts/<name>/upper/        the host's own layer: machine-id, hostname, host key, sshd port, and all it writes
    hosts/<name>/rootfs/       the host's "/": overlayfs of upper/ over the cached rootfs. (A per-host copy took
                               25-75 s per host on a shared disk; the overlay is instant and the cache is read-only.)
    hosts/<name>/disk/         a size-limited tmpfs bound to /root in the host: the release root's filesystem.
                               It outlives a power-off (like a disk); fill_disk/free_disk shrink and restore it
    hosts/<name>/state.json    the systemd-nspawn pid, port, boot time
    hosts/<name>/console.log   the host's console

Each host: systemd as PID 1 (persistent journald), sshd on 127.0.0.1:<port_base + index> (the host network is
shared; local = index 0), its own machine-id, hostname and host key. Nothing is mocked: opsctl talks to them as
to any host. Mount sources and machine names carry ``kdtb-<tag>-`` (tag = hash of the state directory), which is
how `down` proves nothing of this testbed is left.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from .errors import OpsError, TestbedError
from .inventory import HostConfig, Inventory
from .inventory import load as load_inventory

STATE_ENV = "OPSCTL_TESTBED_DIR"
CACHE_ENV = "OPSCTL_TESTBED_CACHE"
PORT_BASE_ENV = "OPSCTL_TESTBED_PORT_BASE"
MIRROR_ENV = "OPSCTL_DEBIAN_MIRROR"
DEFAULT_STATE_DIR = ".testbed"
# One rootfs cache per machine (1.3 GB): every testbed and checkout shares it unless $OPSCTL_TESTBED_CACHE says else.
DEFAULT_CACHE_DIR = "/var/cache/opsctl-testbed"
# A long local step (debootstrap, pip) reports its elapsed time and last log line this often.
PROGRESS_EVERY_S = 15.0
DEFAULT_PORT_BASE = 2220
DEFAULT_HOSTS = 2
DISK_MB = 1024  # size of each host's /root filesystem (tmpfs: only what is written uses memory)
SUITE = "bookworm"
DEFAULT_MIRROR = "http://deb.debian.org/debian"
PACKAGES = (
    "systemd",
    "systemd-sysv",
    "dbus",
    "openssh-server",
    "rsync",
    "python3",
    "python3-pip",
    "python3-venv",
    "procps",
    "iproute2",
    "sudo",
    "libgomp1",
    "ca-certificates",
)
# Installed into the rootfs from wheels downloaded here (torch's CPU wheel lies on disk; pip resolves its deps).
PIP_REQUIREMENTS = ("torch==2.13.0", "numpy")
# Bump when the way the rootfs is configured changes, so cached rootfs are rebuilt.
RECIPE_VERSION = 3
# Units of a stock Debian that only slow a test host down or touch what it does not have.
MASKED_UNITS = (
    "apt-daily.timer",
    "apt-daily-upgrade.timer",
    "dpkg-db-backup.timer",
    "e2scrub_all.timer",
    "e2scrub_reap.service",
    "fstrim.timer",
    "getty@tty1.service",
    "console-getty.service",
    "systemd-pstore.service",
)
# Tool -> Debian package that provides it.
REQUIRED_TOOLS = {
    "systemd-nspawn": "systemd-container",
    "debootstrap": "debootstrap",
    "rsync": "rsync",
    "ssh": "openssh-client",
    "ssh-keygen": "openssh-client",
    "nsenter": "util-linux",
}
BOOT_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 20.0

Log = Callable[[str], None]


def _quiet(_: str) -> None:
    pass


# ---------------------------------------------------------------------------------------------- pure helpers


def host_names(count: int) -> list[str]:
    """``local`` plus ``tb1..tbN``."""
    return ["local", *(f"tb{i}" for i in range(1, count + 1))]


def host_index(name: str) -> int:
    return 0 if name == "local" else int(name.removeprefix("tb"))


def recipe_key(
    suite: str = SUITE, packages: tuple[str, ...] = PACKAGES, pip: tuple[str, ...] = PIP_REQUIREMENTS
) -> str:
    """Cache key of a rootfs: everything that goes into building it."""
    text = json.dumps({"suite": suite, "packages": sorted(packages), "pip": list(pip), "recipe": RECIPE_VERSION})
    return hashlib.sha256(text.encode()).hexdigest()[:16]


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


def free_port_base(start: int, width: int, in_use: Callable[[int], bool], step: int = 10, tries: int = 100) -> int:
    """The first base from ``start`` (in steps) whose ``width`` ports are all free."""
    for base in range(start, start + step * tries, step):
        if base + width <= 65535 and not any(in_use(p) for p in range(base, base + width)):
            return base
    raise TestbedError(f"no {width} free loopback ports from {start} on; set {PORT_BASE_ENV}")


def inventory_text(testbed: Testbed, ports: dict[str, int]) -> str:
    """The testbed's inventory.yaml. Short gate deadlines: the replay service prints parity lines at once."""
    lines = [
        f"# Written by `opsctl testbed up` for the hosts under {testbed.state_dir}. Regenerated on every up.",
        "default: local   # the host of a command given none (opsctl status, opsctl logs --grep shapes)",
        "defaults:",
        "  user: root",
        f"  identity_file: {testbed.client_key}",
        f"  known_hosts: {testbed.known_hosts}",
        "  host_key_policy: strict",
        "  connect_timeout_s: 5",
        "  command_timeout_s: 300",
        "  root: /root/kdtree-engine",
        "  unit: sglang-k26-ddtree",
        "  gpu_arch: null",
        "  build_timeout_s: 600",
        "  keep_releases: 3",
        f"  min_free_disk_mb: {min(64, DISK_MB // 4)}",
        "  gate:",
        "    deadline_s: 60",
        "    poll_interval_s: 1",
        "    consecutive_passes: 3",
        "  health:",
        f"    disk_warn_mb: {DISK_MB // 8}   # the hosts' /root is {DISK_MB} MB, far below production's warning level",
        "  service:",
        "    mode: replay",
        "    python: /usr/bin/python3",
        "    tp: 2                          # the replay stands in for 2 TP ranks: the gate needs each one",
        "hosts:",
    ]
    names = sorted(ports, key=host_index)
    for name in names:
        lines += [
            f"  {name}:",
            "    address: 127.0.0.1",
            f"    port: {ports[name]}",
            "    service:",
            f"      port: {30000 + (ports[name] - DEFAULT_PORT_BASE) % 5000}   # the network is shared: own port each",
        ]
    fleet = [n for n in names if n != "local"]
    lines += ["groups:", f"  testbed: [{', '.join(names)}]", f"  fleet: [{', '.join(fleet)}]", ""]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------- state


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


def _proc_alive(pid: int | None) -> bool:
    if not pid:
        return False
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)  # reap it if it is our child and has exited
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def _children(pid: int) -> list[int]:
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


def _pidns(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return None


def _container_init(nspawn_pid: int) -> int | None:
    """The container's PID 1: the child of systemd-nspawn that lives in a pid namespace of its own (nspawn's
    short-lived helper children share ours)."""
    ours = _pidns(os.getpid())
    for kid in _children(nspawn_pid):
        ns = _pidns(kid)
        if ns is not None and ns != ours:
            return kid
    return None


def _root_mount(pid: int) -> tuple[str, str] | None:
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


def _sshd_answers(port: int, timeout: float = 1.0) -> bool:
    """True when something on 127.0.0.1:port sends an SSH banner."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            s.settimeout(timeout)
            return s.recv(64).startswith(b"SSH-")
    except OSError:
        return False


def _port_in_use(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def last_log_line(path: Path, limit: int = 8192) -> str:
    """The last non-empty line of a log file (read from its end only), for progress reports."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - limit))
            tail = f.read().decode(errors="replace")
    except OSError:
        return ""
    lines = [line.strip() for line in tail.replace("\r", "\n").splitlines() if line.strip()]
    return lines[-1] if lines else ""


def _run(
    argv: list[str],
    *,
    log_file: Path | None = None,
    timeout: float | None = None,
    what: str = "",
    progress: Log | None = None,
    every_s: float = PROGRESS_EVERY_S,
) -> None:
    """Run a local command; on failure raise TestbedError with the tail of its output. With ``progress`` and a
    ``log_file``, every ``every_s`` seconds it reports the elapsed time and the log's last line."""
    out = open(log_file, "ab") if log_file else subprocess.DEVNULL
    try:
        if log_file:
            out.write(f"\n$ {' '.join(argv)}\n".encode())
            out.flush()
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT if log_file else subprocess.PIPE,
        )
        start = time.monotonic()
        next_report = start + every_s
        while True:
            try:
                _, stderr = proc.communicate(timeout=max(0.05, min(next_report - time.monotonic(), 1.0)))
                break
            except subprocess.TimeoutExpired:
                now = time.monotonic()
                if timeout is not None and now - start > timeout:
                    proc.kill()
                    proc.communicate()
                    raise TestbedError(f"{what or argv[0]} did not finish within {timeout:g}s") from None
                if progress is not None and log_file is not None and now >= next_report:
                    progress(f"  {what or argv[0]}: {now - start:.0f}s, last: {last_log_line(log_file)[:160]}")
                    next_report = now + every_s
    finally:
        if log_file:
            out.close()
    if proc.returncode != 0:
        if log_file:
            tail = "\n".join(log_file.read_text(errors="replace").splitlines()[-15:])
            raise TestbedError(f"{what or argv[0]} failed (exit {proc.returncode}); see {log_file}:\n{tail}")
        err = (stderr or b"").decode(errors="replace").strip()
        raise TestbedError(f"{what or argv[0]} failed (exit {proc.returncode}): {err[-2000:]}")


# ---------------------------------------------------------------------------------------------- the testbed


class Testbed:
    """One testbed: a state directory, a rootfs cache and a port range."""

    __test__ = False  # not a pytest test class

    def __init__(
        self, state_dir: Path | str | None = None, *, cache_dir: Path | str | None = None, port_base: int | None = None
    ) -> None:
        self.state_dir = Path(state_dir or os.environ.get(STATE_ENV) or DEFAULT_STATE_DIR).absolute()
        self.cache_dir = Path(cache_dir or os.environ.get(CACHE_ENV) or DEFAULT_CACHE_DIR).absolute()
        # The base in use is recorded while hosts exist (it may have been moved past busy ports at the first up).
        recorded = self.state_dir / "port_base"
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
        return self.cache_dir / f"rootfs-{recipe_key()}"

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

    def _state(self, name: str) -> HostState:
        path = self.host_dir(name) / "state.json"
        try:
            return HostState(**json.loads(path.read_text()))
        except (OSError, ValueError, TypeError) as e:
            raise TestbedError(
                f"testbed host {name!r} is not provisioned ({path}: {e}); run `opsctl testbed up`"
            ) from None

    def _save(self, st: HostState) -> None:
        path = self.host_dir(st.name) / "state.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(st), indent=1))
        tmp.replace(path)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """One testbed operation at a time (several test sessions may share a testbed)."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        with open(self.state_dir / ".lock", "w") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    def running(self, name: str) -> bool:
        st = self._state(name)
        return _proc_alive(st.pid) and any(
            a.startswith("--machine=") and a.endswith(st.machine) for a in _cmdline(st.pid or 0)
        )

    # -- prerequisites -------------------------------------------------------------------------------------

    @staticmethod
    def check_prerequisites() -> None:
        problem = prerequisite_problem(os.geteuid(), missing_tools())
        if problem:
            raise TestbedError(problem)

    # -- rootfs ----------------------------------------------------------------------------------------------

    def ensure_rootfs(self, log: Log = _quiet) -> tuple[Path, float | None]:
        """The cached rootfs, built first if missing. Returns (path, build seconds or None when cached)."""
        final = self.cached_rootfs()
        if (final / "etc/opsctl-testbed-recipe").is_file():
            return final, None
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        with open(self.cache_dir / ".build.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # a second builder waits, then finds the finished one
            if (final / "etc/opsctl-testbed-recipe").is_file():
                return final, None
            for stale in self.cache_dir.glob(f"{final.name}.building-*"):
                shutil.rmtree(stale, ignore_errors=True)
            if final.exists():  # a complete-looking dir without the marker is not ours to trust
                shutil.rmtree(final)
            start = time.monotonic()
            tmp = self.cache_dir / f"{final.name}.building-{os.getpid()}"
            log_file = self.cache_dir / f"{final.name}.build.log"
            log_file.write_text("")
            try:
                self._build_rootfs(tmp, log_file, log)
                tmp.rename(final)
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
            return final, time.monotonic() - start

    def _build_rootfs(self, root: Path, log_file: Path, log: Log) -> None:
        mirror = os.environ.get(MIRROR_ENV) or DEFAULT_MIRROR
        log(f"debootstrap {SUITE} (minbase + {len(PACKAGES)} packages) from {mirror} -> {root} (log: {log_file})")
        t = time.monotonic()
        _run(
            ["debootstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}", SUITE, str(root), mirror],
            log_file=log_file,
            timeout=1800,
            what="debootstrap",
            progress=log,
        )
        log(f"  debootstrap done in {time.monotonic() - t:.0f}s")
        # Host keys are made per host; a shared one would make every host the same to ssh.
        for key in (root / "etc/ssh").glob("ssh_host_*"):
            key.unlink()
        (root / "etc/machine-id").write_text("")
        (root / "var/log/journal").mkdir(parents=True, exist_ok=True)  # persistent journal, as on a real host
        (root / "etc/default/locale").write_text("LANG=C.UTF-8\n")
        for unit in MASKED_UNITS:
            link = root / "etc/systemd/system" / unit
            link.unlink(missing_ok=True)
            link.symlink_to("/dev/null")
        for wants in (root / "etc/systemd/system").glob("*.wants"):
            for unit in MASKED_UNITS:
                (wants / unit).unlink(missing_ok=True)

        wheels = root / "opt/wheels"
        wheels.mkdir(parents=True)
        log(f"pip download {' '.join(PIP_REQUIREMENTS)} (the CPU torch wheel lies on this machine)")
        t = time.monotonic()
        download = [sys.executable, "-m", "pip", "download", "--quiet", "--only-binary=:all:", "-d", str(wheels)]
        if sys.version_info[:2] != (3, 11):  # the rootfs has bookworm's python3.11
            download += ["--python-version", "3.11", "--implementation", "cp", "--abi", "cp311",
                         "--platform", "manylinux_2_28_x86_64", "--platform", "manylinux_2_17_x86_64",
                         "--platform", "manylinux2014_x86_64"]  # fmt: skip
        _run([*download, *PIP_REQUIREMENTS], log_file=log_file, timeout=1800, what="pip download", progress=log)
        log("installing them into the rootfs")
        _run(
            [*self._nspawn_cmd(root), "python3", "-m", "pip", "install", "--no-index", "--find-links", "/opt/wheels",
             "--break-system-packages", "--root-user-action=ignore", "--no-cache-dir", "--quiet",
             *PIP_REQUIREMENTS],
            log_file=log_file,
            timeout=1800,
            what="pip install in the rootfs",
            progress=log,
        )  # fmt: skip
        shutil.rmtree(wheels)
        _run(
            [*self._nspawn_cmd(root), "python3", "-c", "import torch, numpy; torch.ones(2) @ torch.ones(2)"],
            log_file=log_file,
            timeout=300,
            what="import torch in the rootfs",
        )
        log(f"  torch installed and imports in {time.monotonic() - t:.0f}s")
        (root / "etc/opsctl-testbed-recipe").write_text(recipe_key() + "\n")

    @staticmethod
    def _nspawn_cmd(root: Path) -> list[str]:
        """Run one command inside a rootfs (not booted)."""
        return [
            "systemd-nspawn",
            "--quiet",
            "--register=no",
            "--keep-unit",
            "--pipe",
            "--link-journal=no",
            "-D",
            str(root),
        ]

    # -- provisioning -----------------------------------------------------------------------------------------

    def _ensure_client_key(self) -> None:
        if not self.client_key.is_file():
            self.client_key.parent.mkdir(parents=True, exist_ok=True)
            _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "opsctl-testbed", "-f", str(self.client_key)])

    def _provision(self, name: str, base: Path) -> None:
        """A fresh host directory: an overlay over the cached rootfs (its own upper layer), identity, host key,
        authorized key, sshd port. Everything is written into the upper layer before anything is mounted, and
        the directory is renamed into place when complete."""
        hdir = self.host_dir(name)
        if hdir.exists():
            self._umount_all(name)
            shutil.rmtree(hdir)
        tmp = self.hosts_dir / f".{name}.provisioning"
        shutil.rmtree(tmp, ignore_errors=True)
        for sub in ("upper/etc/ssh/sshd_config.d", "work", "rootfs", "disk", "root-skel"):
            (tmp / sub).mkdir(parents=True)
        upper = tmp / "upper"
        (upper / "etc/machine-id").write_text(uuid.uuid4().hex + "\n")
        (upper / "etc/hostname").write_text(name + "\n")
        hosts = (base / "etc/hosts").read_text() if (base / "etc/hosts").exists() else ""
        (upper / "etc/hosts").write_text(f"127.0.0.1\tlocalhost\n127.0.1.1\t{name}\n" + hosts)
        key = upper / "etc/ssh/ssh_host_ed25519_key"
        _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"root@{name}", "-f", str(key)])
        port = self.port_base + host_index(name)
        (upper / "etc/ssh/sshd_config.d/opsctl-testbed.conf").write_text(
            "# opsctl testbed: the host network is shared, so each host listens on its own loopback port.\n"
            f"Port {port}\nListenAddress 127.0.0.1\nHostKey /etc/ssh/ssh_host_ed25519_key\n"
            "PermitRootLogin prohibit-password\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n"
            "UseDNS no\nMaxStartups 100:30:200\nMaxSessions 64\n"
        )
        # /root is the host's "disk" (see _mount_disk); its initial content is copied in when that is mounted.
        _run(["cp", "-a", f"{base}/root/.", str(tmp / "root-skel")], what=f"copy of /root for {name}")
        ssh_dir = tmp / "root-skel/.ssh"
        ssh_dir.mkdir(mode=0o700, exist_ok=True)
        shutil.copy(self.client_key.with_suffix(".pub"), ssh_dir / "authorized_keys")
        os.chmod(ssh_dir / "authorized_keys", 0o600)
        tmp.rename(hdir)
        self._save(HostState(name=name, port=port, machine=self.machine(name), base=str(base)))

    def _mount_rootfs(self, name: str) -> None:
        """The host's "/": overlayfs, the cached rootfs below (read-only, shared), the host's own layer above."""
        rootfs = self.rootfs(name)
        if os.path.ismount(rootfs) or not (self.host_dir(name) / "upper").is_dir():
            return  # mounted already, or a full copy made by an older opsctl
        st = self._state(name)
        base = Path(st.base or self.cached_rootfs())
        if not (base / "etc/opsctl-testbed-recipe").is_file():
            raise TestbedError(f"{name}'s base rootfs {base} is gone; `opsctl testbed down` and up again")
        hdir = self.host_dir(name)
        opts = f"lowerdir={base},upperdir={hdir / 'upper'},workdir={hdir / 'work'}"
        _run(["mount", "-t", "overlay", "-o", opts, self.machine(name), str(rootfs)], what=f"mount of {name}'s /")

    def _umount_all(self, name: str) -> None:
        for path in (self.disk(name), self.rootfs(name)):
            if os.path.ismount(path):
                _run(["umount", str(path)], what=f"umount {path}")

    def _mount_disk(self, name: str) -> None:
        disk = self.disk(name)
        if os.path.ismount(disk):
            return
        disk.mkdir(exist_ok=True)
        _run(
            ["mount", "-t", "tmpfs", "-o", f"size={DISK_MB}m,mode=0700", f"{self.machine(name)}-disk", str(disk)],
            what=f"mount of {name}'s disk",
        )
        skel = self.host_dir(name) / "root-skel"
        if skel.is_dir():
            _run(["cp", "-a", f"{skel}/.", str(disk)], what=f"fill of {name}'s /root")

    def _write_known_hosts_and_inventory(self) -> None:
        names = self.provisioned()
        lines = []
        for name in names:
            layer = self.host_dir(name) / "upper"
            pub = (
                ((layer if layer.is_dir() else self.rootfs(name)) / "etc/ssh/ssh_host_ed25519_key.pub")
                .read_text()
                .split()
            )
            lines.append(f"[127.0.0.1]:{self._state(name).port} {pub[0]} {pub[1]}\n")
        tmp = self.known_hosts.with_suffix(".tmp")
        tmp.write_text("".join(lines))
        tmp.replace(self.known_hosts)
        tmp = self.inventory_path.with_suffix(".tmp")
        tmp.write_text(inventory_text(self, {name: self._state(name).port for name in names}))
        tmp.replace(self.inventory_path)

    # -- power -------------------------------------------------------------------------------------------------

    def _start(self, name: str) -> float:
        """Boot a provisioned host and wait for its sshd. Returns the seconds it took."""
        st = self._state(name)
        if self.running(name):
            return 0.0
        if _port_in_use(st.port):
            raise TestbedError(
                f"port {st.port} on 127.0.0.1 is already in use, so {name}'s sshd cannot listen there; stop what "
                f"uses it or pick other ports with {PORT_BASE_ENV}"
            )
        self._mount_rootfs(name)
        self._mount_disk(name)
        console = self.host_dir(name) / "console.log"
        argv = [
            "systemd-nspawn", "--quiet", "--register=no", "--keep-unit", "--boot", "--link-journal=no",
            "--console=read-only", f"--machine={st.machine}", f"--hostname={name}",
            f"--bind={self.disk(name)}:/root", "-D", str(self.rootfs(name)),
        ]  # fmt: skip
        start = time.monotonic()
        with open(console, "ab") as out:
            proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        st.pid, st.init_pid, st.pidns, st.booted_at, st.boot_s = proc.pid, None, None, time.time(), None
        self._save(st)
        deadline = start + BOOT_TIMEOUT_S
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                tail = "\n".join(console.read_text(errors="replace").splitlines()[-15:])
                raise TestbedError(f"{name} did not boot: systemd-nspawn exited {proc.returncode}; {console}:\n{tail}")
            if st.init_pid is None:
                st.init_pid = _container_init(proc.pid)
                st.pidns = _pidns(st.init_pid) if st.init_pid else None
            if _sshd_answers(st.port, timeout=0.5):
                st.boot_s = time.monotonic() - start
                self._save(st)
                return st.boot_s
            time.sleep(0.1)
        raise TestbedError(
            f"{name} booted but its sshd did not answer on 127.0.0.1:{st.port} within {BOOT_TIMEOUT_S:g}s; see {console}"
        )

    def _stop(self, name: str, *, hard: bool) -> None:
        """Shut a host down (SIGTERM to nspawn: orderly poweroff) or kill it (SIGKILL to its PID 1)."""
        st = self._state(name)
        if not self.running(name):  # also guards against a recycled pid
            return
        assert st.pid is not None
        init = _container_init(st.pid)
        if hard and init:
            with contextlib.suppress(ProcessLookupError):
                os.kill(init, signal.SIGKILL)  # the kernel kills the whole pid namespace with it
        else:
            with contextlib.suppress(ProcessLookupError):
                os.kill(st.pid, signal.SIGTERM)  # nspawn turns it into SIGRTMIN+3: systemd's orderly poweroff
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while _proc_alive(st.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        if _proc_alive(st.pid):
            if init:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(init, signal.SIGKILL)
            time.sleep(0.5)
            with contextlib.suppress(ProcessLookupError):
                os.kill(st.pid, signal.SIGKILL)
            deadline = time.monotonic() + 10
            while _proc_alive(st.pid) and time.monotonic() < deadline:
                time.sleep(0.05)
        if _proc_alive(st.pid):
            raise TestbedError(f"{name}: systemd-nspawn (pid {st.pid}) does not exit")

    def _nsenter(self, name: str, argv: list[str], timeout: float = 60) -> None:
        """Run a command inside a running host without ssh (for fault injection on sshd itself)."""
        st = self._state(name)
        if not self.running(name) or not st.init_pid:
            raise TestbedError(f"{name} is not running")
        _run(
            ["nsenter", "-t", str(st.init_pid), "-m", "-u", "-i", "-p", "-r", "-w", *argv],
            timeout=timeout,
            what=" ".join(argv),
        )

    # -- public operations -----------------------------------------------------------------------------------

    def up(self, count: int = DEFAULT_HOSTS, log: Log = _quiet) -> UpReport:
        """Build (once) and boot ``local`` + tb1..tbN. Hosts already running are kept as they are."""
        if count < 0 or count > 50:
            raise TestbedError(f"host count {count} out of range 0..50")
        self.check_prerequisites()
        if any(c in str(self.state_dir) for c in " ;$`'\"\\"):
            raise TestbedError(
                f"testbed directory {self.state_dir} has spaces or shell characters; pick another with {STATE_ENV}"
            )
        total = time.monotonic()
        with self._locked():
            base, build_s = self.ensure_rootfs(log)
            how = f"built in {build_s:.0f}s" if build_s is not None else "cached"
            log(f"rootfs: {base} ({how})")
            self._ensure_client_key()
            names = host_names(count)
            if not self.provisioned():
                first_port = free_port_base(self.port_base, count + 1, _port_in_use)
                if first_port != self.port_base:
                    log(f"ports {self.port_base}.. are in use here: this testbed uses {first_port}..")
                self.port_base = first_port
                (self.state_dir / "port_base").write_text(f"{first_port}\n")
            t = time.monotonic()
            for name in names:
                if name not in self.provisioned():
                    log(f"provisioning {name}")
                    self._provision(name, base)
            provision_s = time.monotonic() - t
            self._write_known_hosts_and_inventory()
            t = time.monotonic()
            for name in self.provisioned():
                if not self.running(name):
                    secs = self._start(name)
                    log(f"{name}: sshd answering on 127.0.0.1:{self._state(name).port} after {secs:.1f}s")
            boot_s = time.monotonic() - t
        return UpReport(
            hosts=self.status(),
            inventory=self.inventory_path,
            rootfs_build_s=build_s,
            provision_s=provision_s,
            boot_s=boot_s,
            total_s=time.monotonic() - total,
        )

    def down(self, log: Log = _quiet) -> list[str]:
        """Stop every host, unmount its layers, remove its directory (the rootfs cache stays). Returns what was
        left over and had to be killed or unmounted; raises if anything is still there afterwards."""
        with self._locked():
            names = self.provisioned()
            for name in names:
                t = time.monotonic()
                self._stop(name, hard=False)
                log(f"{name}: stopped in {time.monotonic() - t:.1f}s")
            stray = self.leftover_processes()
            for item in stray:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(item.split()[1]), signal.SIGKILL)
            if stray:
                time.sleep(0.5)
            for name in names:
                self._umount_all(name)
            stray += self.leftover_mounts()
            for mountpoint in self.leftover_mounts():
                subprocess.run(["umount", "-l", mountpoint.split()[1]], check=False, stdin=subprocess.DEVNULL)
            for name in names:
                shutil.rmtree(self.host_dir(name))
            for path in (self.known_hosts, self.inventory_path, self.state_dir / "port_base"):
                path.unlink(missing_ok=True)
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
            if not d.name.isdigit() or int(d.name) == os.getpid() or not _proc_alive(int(d.name)):
                continue
            args = _cmdline(int(d.name))
            root = _root_mount(int(d.name))
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
            st = self._state(name)
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
                    sshd=running and _sshd_answers(st.port),
                    pid=st.pid if running else None,
                    boot_s=st.boot_s if running else None,
                    disk_free_mb=free,
                )
            )
        return out

    # -- fault injection (tests) ---------------------------------------------------------------------------------

    def poweroff(self, name: str) -> None:
        """Pull the plug: SIGKILL the host's PID 1. Its /root disk survives, its volatile state does not."""
        with self._locked():
            self._stop(name, hard=True)

    def shutdown(self, name: str) -> None:
        """An orderly poweroff (systemd stops its units)."""
        with self._locked():
            self._stop(name, hard=False)

    def boot(self, name: str) -> float:
        """Boot a stopped host again (same disk, same keys); waits for sshd. Returns boot seconds."""
        with self._locked():
            return self._start(name)

    def stop_sshd(self, name: str) -> None:
        """Stop the host's sshd: new connections are refused, sessions already open go on."""
        self._nsenter(name, ["systemctl", "stop", "ssh.service"])

    def start_sshd(self, name: str) -> None:
        self._nsenter(name, ["systemctl", "start", "ssh.service"])
        st = self._state(name)
        deadline = time.monotonic() + 20
        while not _sshd_answers(st.port) and time.monotonic() < deadline:
            time.sleep(0.1)

    def fill_disk(self, name: str, leave_mb: int = 0) -> None:
        """Make the host's /root filesystem (the release root's) full: its tmpfs shrinks to what is used."""
        disk = self.disk(name)
        if not os.path.ismount(disk):
            raise TestbedError(f"{name}'s disk is not mounted (is the host up?)")
        vfs = os.statvfs(disk)
        used = (vfs.f_blocks - vfs.f_bfree) * vfs.f_frsize
        size_kb = max(used // 1024 + leave_mb * 1024, 4)
        _run(["mount", "-o", f"remount,size={size_kb}k", str(disk)], what=f"shrink of {name}'s disk")

    def free_disk(self, name: str) -> None:
        """Undo fill_disk: the disk gets its full size back."""
        disk = self.disk(name)
        if os.path.ismount(disk):
            _run(["mount", "-o", f"remount,size={DISK_MB}m", str(disk)], what=f"resize of {name}'s disk")


# ---------------------------------------------------------------------------------------------- reset for tests


def reset_host(host: HostConfig, testbed: Testbed | None = None) -> None:
    """Bring a testbed host back to a clean state for the next test.

    Boots it if it was powered off, restores its disk and sshd, then over SSH: stops and removes the unit (and
    its drop-ins), removes the release root, reloads systemd and resets failed units.
    """
    from .ssh import connect  # here: the testbed itself does not need the SSH layer

    tb = testbed or _testbed_of(host)
    if host.name in tb.provisioned():
        tb.free_disk(host.name)
        if not tb.running(host.name):
            tb.boot(host.name)
        elif not _sshd_answers(tb._state(host.name).port):
            tb.start_sshd(host.name)
    unit = f"{host.unit}.service"
    script = " ; ".join(
        [
            f"systemctl stop {unit} 2>/dev/null",
            f"systemctl disable {unit} 2>/dev/null",
            f"rm -rf /etc/systemd/system/{unit} /etc/systemd/system/{unit}.d /run/systemd/system/{unit} "
            f"/run/systemd/system/{unit}.d /etc/systemd/system/multi-user.target.wants/{unit}",
            "systemctl daemon-reload",
            "systemctl reset-failed",
            f"rm -rf {host.root}",
            "true",
        ]
    )
    try:
        with connect(host) as r:
            r.run(script, timeout=60)
    except OpsError as e:
        raise TestbedError(f"reset of {host.name} failed: {e}") from e


def _testbed_of(host: HostConfig) -> Testbed:
    """The testbed a host of a testbed inventory belongs to: its known_hosts file lies in the state directory."""
    state_dir = Path(os.path.expanduser(host.known_hosts)).parent
    return Testbed(state_dir) if (state_dir / "hosts").is_dir() else Testbed()


# ---------------------------------------------------------------------------------------------- module-level API


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
