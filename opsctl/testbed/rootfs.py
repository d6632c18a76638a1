"""The cached rootfs every testbed host boots from: Debian bookworm (debootstrap minbase + PACKAGES) with the CPU
torch wheel, built once per machine and recipe, shared read-only by every testbed and checkout.

    <cache>/rootfs-<key>/              the rootfs (key = hash of the recipe); complete once RECIPE_MARKER is in it
    <cache>/rootfs-<key>.building-<pid>/  a build in progress, renamed into place when complete, so a half build
                                       is never used
    <cache>/rootfs-<key>.build.log     the build's log
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import sys
import time
from pathlib import Path

from .localrun import Log, quiet, run

CACHE_ENV = "OPSCTL_TESTBED_CACHE"
# One rootfs cache per machine (1.3 GB): every testbed and checkout shares it unless $OPSCTL_TESTBED_CACHE says else.
DEFAULT_CACHE_DIR = "/var/cache/opsctl-testbed"
MIRROR_ENV = "OPSCTL_DEBIAN_MIRROR"
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
# Written last into a rootfs: only a rootfs that has it is complete.
RECIPE_MARKER = "etc/opsctl-testbed-recipe"
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


def recipe_key(
    suite: str = SUITE, packages: tuple[str, ...] = PACKAGES, pip: tuple[str, ...] = PIP_REQUIREMENTS
) -> str:
    """Cache key of a rootfs: everything that goes into building it."""
    text = json.dumps({"suite": suite, "packages": sorted(packages), "pip": list(pip), "recipe": RECIPE_VERSION})
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def cached_rootfs(cache_dir: Path) -> Path:
    return cache_dir / f"rootfs-{recipe_key()}"


def is_complete(root: Path) -> bool:
    return (root / RECIPE_MARKER).is_file()


def ensure_rootfs(cache_dir: Path, log: Log = quiet) -> tuple[Path, float | None]:
    """The cached rootfs, built first if missing. Returns (path, build seconds or None when cached)."""
    final = cached_rootfs(cache_dir)
    if is_complete(final):
        return final, None
    cache_dir.mkdir(parents=True, exist_ok=True)
    with open(cache_dir / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a second builder waits, then finds the finished one
        if is_complete(final):
            return final, None
        for stale in cache_dir.glob(f"{final.name}.building-*"):
            shutil.rmtree(stale, ignore_errors=True)
        if final.exists():  # a complete-looking dir without the marker is not ours to trust
            shutil.rmtree(final)
        start = time.monotonic()
        tmp = cache_dir / f"{final.name}.building-{os.getpid()}"
        log_file = cache_dir / f"{final.name}.build.log"
        log_file.write_text("")
        try:
            _build_rootfs(tmp, log_file, log)
            tmp.rename(final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return final, time.monotonic() - start


def _build_rootfs(root: Path, log_file: Path, log: Log) -> None:
    mirror = os.environ.get(MIRROR_ENV) or DEFAULT_MIRROR
    log(f"debootstrap {SUITE} (minbase + {len(PACKAGES)} packages) from {mirror} -> {root} (log: {log_file})")
    t = time.monotonic()
    run(
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
    run([*download, *PIP_REQUIREMENTS], log_file=log_file, timeout=1800, what="pip download", progress=log)
    log("installing them into the rootfs")
    run(
        [*_in_rootfs(root), "python3", "-m", "pip", "install", "--no-index", "--find-links", "/opt/wheels",
         "--break-system-packages", "--root-user-action=ignore", "--no-cache-dir", "--quiet",
         *PIP_REQUIREMENTS],
        log_file=log_file,
        timeout=1800,
        what="pip install in the rootfs",
        progress=log,
    )  # fmt: skip
    shutil.rmtree(wheels)
    run(
        [*_in_rootfs(root), "python3", "-c", "import torch, numpy; torch.ones(2) @ torch.ones(2)"],
        log_file=log_file,
        timeout=300,
        what="import torch in the rootfs",
    )
    log(f"  torch installed and imports in {time.monotonic() - t:.0f}s")
    (root / RECIPE_MARKER).write_text(recipe_key() + "\n")


def _in_rootfs(root: Path) -> list[str]:
    """The prefix that runs one command inside a rootfs that is not booted."""
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
