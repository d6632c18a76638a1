"""One host's directory: provisioned once (its own layer over the cached rootfs: identity, host key, sshd port,
the client's authorized key), then mounted before each boot (the overlay as its "/", a tmpfs as its /root disk)
and unmounted at `down`."""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path

from ..errors import TestbedError
from . import rootfs
from .localrun import run
from .statedir import DISK_MB, HostState, StateDir, host_index


def provision(tb: StateDir, name: str, base: Path) -> None:
    """A fresh host directory: an overlay over the cached rootfs (its own upper layer), identity, host key,
    authorized key, sshd port. Everything is written into the upper layer before anything is mounted, and
    the directory is renamed into place when complete."""
    hdir = tb.host_dir(name)
    if hdir.exists():
        umount_all(tb, name)
        shutil.rmtree(hdir)
    tmp = tb.hosts_dir / f".{name}.provisioning"
    shutil.rmtree(tmp, ignore_errors=True)
    for sub in ("upper/etc/ssh/sshd_config.d", "work", "rootfs", "disk", "root-skel"):
        (tmp / sub).mkdir(parents=True)
    upper = tmp / "upper"
    (upper / "etc/machine-id").write_text(uuid.uuid4().hex + "\n")
    (upper / "etc/hostname").write_text(name + "\n")
    hosts = (base / "etc/hosts").read_text() if (base / "etc/hosts").exists() else ""
    (upper / "etc/hosts").write_text(f"127.0.0.1\tlocalhost\n127.0.1.1\t{name}\n" + hosts)
    key = upper / "etc/ssh/ssh_host_ed25519_key"
    run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"root@{name}", "-f", str(key)])
    port = tb.port_base + host_index(name)
    (upper / "etc/ssh/sshd_config.d/opsctl-testbed.conf").write_text(
        "# opsctl testbed: the host network is shared, so each host listens on its own loopback port.\n"
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey /etc/ssh/ssh_host_ed25519_key\n"
        "PermitRootLogin prohibit-password\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n"
        "UseDNS no\nMaxStartups 100:30:200\nMaxSessions 64\n"
    )
    # /root is the host's "disk" (see mount_disk); its initial content is copied in when that is mounted.
    run(["cp", "-a", f"{base}/root/.", str(tmp / "root-skel")], what=f"copy of /root for {name}")
    ssh_dir = tmp / "root-skel/.ssh"
    ssh_dir.mkdir(mode=0o700, exist_ok=True)
    shutil.copy(tb.client_key.with_suffix(".pub"), ssh_dir / "authorized_keys")
    os.chmod(ssh_dir / "authorized_keys", 0o600)
    tmp.rename(hdir)
    tb.save_state(HostState(name=name, port=port, machine=tb.machine(name), base=str(base)))


def host_key_pub(tb: StateDir, name: str) -> Path:
    """The host's public host key: in its own layer (or, for a full copy made by an older opsctl, its rootfs)."""
    layer = tb.host_dir(name) / "upper"
    return (layer if layer.is_dir() else tb.rootfs(name)) / "etc/ssh/ssh_host_ed25519_key.pub"


def mount_rootfs(tb: StateDir, name: str) -> None:
    """The host's "/": overlayfs, the cached rootfs below (read-only, shared), the host's own layer above."""
    root = tb.rootfs(name)
    if os.path.ismount(root) or not (tb.host_dir(name) / "upper").is_dir():
        return  # mounted already, or a full copy made by an older opsctl
    st = tb.state(name)
    base = Path(st.base or tb.cached_rootfs())
    if not rootfs.is_complete(base):
        raise TestbedError(f"{name}'s base rootfs {base} is gone; `opsctl testbed down` and up again")
    hdir = tb.host_dir(name)
    opts = f"lowerdir={base},upperdir={hdir / 'upper'},workdir={hdir / 'work'}"
    run(["mount", "-t", "overlay", "-o", opts, tb.machine(name), str(root)], what=f"mount of {name}'s /")


def mount_disk(tb: StateDir, name: str) -> None:
    disk = tb.disk(name)
    if os.path.ismount(disk):
        return
    disk.mkdir(exist_ok=True)
    run(
        ["mount", "-t", "tmpfs", "-o", f"size={DISK_MB}m,mode=0700", f"{tb.machine(name)}-disk", str(disk)],
        what=f"mount of {name}'s disk",
    )
    skel = tb.host_dir(name) / "root-skel"
    if skel.is_dir():
        run(["cp", "-a", f"{skel}/.", str(disk)], what=f"fill of {name}'s /root")


def umount_all(tb: StateDir, name: str) -> None:
    for path in (tb.disk(name), tb.rootfs(name)):
        if os.path.ismount(path):
            run(["umount", str(path)], what=f"umount {path}")
