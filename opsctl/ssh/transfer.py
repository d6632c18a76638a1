"""The OpenSSH and rsync command lines that reach a host with the same settings as ``connect``, and rsync's stats.

rsync runs OpenSSH with the same endpoint, identity, known_hosts file, StrictHostKeyChecking=yes and ProxyJump.
Pure: tested without a host (``Remote.rsync`` runs what these build).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from .endpoint import KEEPALIVE_S, Endpoint, ssh_config_path


@dataclass(frozen=True)
class RsyncStats:
    bytes_sent: int
    files_transferred: int
    elapsed_s: float


def _ssh_options(ep: Endpoint) -> list[str]:
    cfg = ssh_config_path()
    return [
        "-F", str(cfg) if cfg.is_file() else "/dev/null",
        "-o", "BatchMode=yes",
        "-o", "StrictHostKeyChecking=yes",
        "-o", f"UserKnownHostsFile={ep.known_hosts}",
        "-o", "GlobalKnownHostsFile=/dev/null",
        "-o", f"ConnectTimeout={max(1, round(ep.connect_timeout_s))}",
        "-o", f"ServerAliveInterval={KEEPALIVE_S}",
        "-o", "ServerAliveCountMax=3",
    ]  # fmt: skip


def _identity_options(files: Sequence[str]) -> list[str]:
    argv: list[str] = []
    for ident in files:
        argv += ["-i", ident]
    return [*argv, "-o", "IdentitiesOnly=yes"] if files else argv


def openssh_command(ep: Endpoint) -> list[str]:
    """OpenSSH argv (without the destination) with the same endpoint, identity, known_hosts and hops as ``connect``.

    ProxyJump hops become an explicit ProxyCommand chain so that the hops' host keys are checked against the same
    known_hosts file too (``-J`` would fall back to ~/.ssh/known_hosts for them).
    """
    proxy: str | None = None
    for hop in ep.jumps:
        hop_argv = ["ssh", *_ssh_options(ep), *_identity_options(hop.identity_files or ep.identity_files)]
        if proxy:
            hop_argv += ["-o", f"ProxyCommand={proxy}"]
        hop_argv += ["-p", str(hop.port), "-l", hop.user, "-W", "%h:%p", hop.hostname]
        proxy = shlex.join(hop_argv)
    argv = ["ssh", *_ssh_options(ep), *_identity_options(ep.identity_files), "-p", str(ep.port), "-l", ep.user]
    if proxy:
        argv += ["-o", f"ProxyCommand={proxy}"]
    return argv


def rsync_argv(
    ep: Endpoint,
    local: Path,
    remote_dir: str,
    link_dest: str | None,
    delete: bool,
    exclude: Sequence[str],
    sudo: bool,
) -> list[str]:
    """The rsync command line. Pure: tested without a host.

    ``--checksum``: a file counts as unchanged (linked from ``link_dest``, or left alone where the destination
    already holds it) only when its content matches, not its size and modification time alone (rsync's quick
    check). A file changed within the same second at the same size was otherwise never sent, and every retry
    after the verify step's mismatch skipped it again (issue 47). It costs one read of the files on both sides.
    """
    argv = ["rsync", "-a", "--checksum", "--stats", "-e", shlex.join(openssh_command(ep))]
    if sudo:
        argv.append("--rsync-path=sudo -n rsync")
    if link_dest:
        argv.append(f"--link-dest={link_dest}")
    if delete:
        argv.append("--delete")
    argv += [f"--exclude={pattern}" for pattern in exclude]
    # The host part is the known_hosts name's address; OpenSSH gets port and user from -p/-l.
    target = ep.hostname if ":" not in ep.hostname else f"[{ep.hostname}]"
    argv += [f"{local}/", f"{target}:{remote_dir.rstrip('/')}/"]
    return argv


_STAT_RE = {
    "bytes_sent": re.compile(r"^Total bytes sent:\s*([\d,.]+)", re.M),
    "files": re.compile(r"^Number of regular files transferred:\s*([\d,.]+)", re.M),
}


def parse_rsync_stats(stdout: str, elapsed_s: float) -> RsyncStats:
    def num(key: str) -> int:
        m = _STAT_RE[key].search(stdout)
        return int(re.sub(r"[,.]", "", m.group(1))) if m else 0

    return RsyncStats(bytes_sent=num("bytes_sent"), files_transferred=num("files"), elapsed_s=elapsed_s)
