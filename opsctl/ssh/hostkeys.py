"""Host keys, OpenSSH's way: checked against the host's own known_hosts file (inventory ``known_hosts``) only.

An unknown key is refused with its type and SHA256 fingerprint unless accepting is asked for
(``accept_new_host_key=True`` or ``host_key_policy: accept-new``), which then appends it to that file; a changed key
is always refused (by ``client.connect``, which names both keys).
"""

from __future__ import annotations

import base64
import hashlib
import os
import threading
from pathlib import Path

import paramiko

from ..errors import HostKeyUnknown


def fingerprint(key: paramiko.PKey) -> str:
    """OpenSSH's SHA256 fingerprint of a public key (``SHA256:...``, unpadded base64)."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


class _HostKeyPolicy(paramiko.MissingHostKeyPolicy):
    """Unknown key: refuse with its fingerprint, or (accept-new) append it to the known_hosts file."""

    def __init__(self, host_name: str, known_hosts: Path, accept_new: bool) -> None:
        self.host_name = host_name
        self.known_hosts = known_hosts
        self.accept_new = accept_new

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        if not self.accept_new:
            raise HostKeyUnknown(
                self.host_name,
                f"host key of {hostname} is not in {self.known_hosts}: {key.get_name()} {fingerprint(key)}. "
                "Check the fingerprint on the host (ssh-keygen -lf /etc/ssh/ssh_host_*_key.pub), then rerun "
                "with --accept-new-host-key (or set host_key_policy: accept-new)",
            )
        _append_known_host(self.known_hosts, hostname, key)
        client.get_host_keys().add(hostname, key.get_name(), key)


_known_hosts_lock = threading.Lock()


def _append_known_host(path: Path, hostname: str, key: paramiko.PKey) -> None:
    with _known_hosts_lock:
        path.parent.mkdir(parents=True, exist_ok=True)
        line = f"{hostname} {key.get_name()} {key.get_base64()}\n"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            # Keep a file without a trailing newline parseable.
            if os.fstat(fd).st_size and not path.read_bytes().endswith(b"\n"):
                line = "\n" + line
            os.write(fd, line.encode())
        finally:
            os.close(fd)


def new_client(known_hosts: Path, host_name: str, accept_new: bool) -> paramiko.SSHClient:
    """A Paramiko client that trusts the keys of ``known_hosts`` and nothing else (see the module's docstring)."""
    client = paramiko.SSHClient()
    # Only the inventory's known_hosts file counts; no system files, no ~/.ssh/known_hosts unless named.
    if known_hosts.is_file():
        try:
            client.get_host_keys().load(str(known_hosts))
        except (OSError, paramiko.SSHException) as e:
            raise HostKeyUnknown(host_name, f"cannot read known_hosts {known_hosts}: {e}") from e
    client.set_missing_host_key_policy(_HostKeyPolicy(host_name, known_hosts, accept_new))
    return client
