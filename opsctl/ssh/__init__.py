"""The SSH layer: the only way opsctl reaches a host.

- ``client``: ``connect(host)`` yields a ``Remote``, a live Paramiko session that runs commands (each with a timeout
  that kills it on the host), writes and reads files, and rsyncs a directory;
- ``endpoint``: where to connect (inventory + ssh_config, ProxyJump hops), pure;
- ``hostkeys``: host keys checked against the inventory's known_hosts file only, fingerprints;
- ``transfer``: the OpenSSH and rsync command lines with the same settings, rsync's stats, pure;
- ``wrap``: the shell commands the session itself runs on the host (the ``sh -c`` wrapper, the timeout's killer);
- ``remote``: the ``Remote`` protocol that code running host commands depends on (the tests' local shells too);
- ``session``: one connection re-opened after a drop;
- ``hostprogram``: ``HostProgram``, the one way opsctl runs a program of its own on a host (the probe traffic, the
  health probe, the capture listing): its text and its configuration on stdin, nothing in argv.

    from opsctl.ssh import connect
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# The names below are imported on first use (PEP 562): code that only needs the pure modules (``remote``, ``wrap``,
# ``transfer``), the gate's parsers and every command that connects nowhere, never loads Paramiko (``opsctl --help``
# starts at once; tests/cli/test_startup.py pins it).
_HOME = {
    "CommandResult": "client",
    "SshSession": "client",
    "connect": "client",
    "SSH_CONFIG_ENV": "endpoint",
    "Endpoint": "endpoint",
    "Jump": "endpoint",
    "known_hosts_name": "endpoint",
    "resolve_endpoint": "endpoint",
    "ssh_config_path": "endpoint",
    "fingerprint": "hostkeys",
    "RsyncStats": "transfer",
    "openssh_command": "transfer",
    "parse_rsync_stats": "transfer",
    "rsync_argv": "transfer",
}

if TYPE_CHECKING:
    from .client import CommandResult, SshSession, connect
    from .endpoint import SSH_CONFIG_ENV, Endpoint, Jump, known_hosts_name, resolve_endpoint, ssh_config_path
    from .hostkeys import fingerprint
    from .transfer import RsyncStats, openssh_command, parse_rsync_stats, rsync_argv


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_HOME[name]}", __name__), name)
    globals()[name] = value
    return value


__all__ = [
    "SSH_CONFIG_ENV",
    "CommandResult",
    "Endpoint",
    "Jump",
    "RsyncStats",
    "SshSession",
    "connect",
    "fingerprint",
    "known_hosts_name",
    "openssh_command",
    "parse_rsync_stats",
    "resolve_endpoint",
    "rsync_argv",
    "ssh_config_path",
]
