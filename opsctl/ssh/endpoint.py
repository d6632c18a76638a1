"""Where and how to reach a host: the inventory's settings with ssh_config applied (``resolve_endpoint``).

Pure given an ssh_config: tested without a host. ``ssh_alias`` is looked up in the ssh_config file
(``$OPSCTL_SSH_CONFIG`` or ``~/.ssh/config``): HostName, Port, User, IdentityFile and ProxyJump there win over the
inventory.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

import paramiko

from ..inventory import HostConfig

SSH_CONFIG_ENV = "OPSCTL_SSH_CONFIG"
# Both the Paramiko session and the OpenSSH that rsync runs send a keepalive this often (seconds).
KEEPALIVE_S = 15


@dataclass(frozen=True)
class Jump:
    """One ProxyJump hop."""

    hostname: str
    port: int
    user: str
    identity_files: tuple[str, ...]


@dataclass(frozen=True)
class Endpoint:
    """Where and how to connect, after ssh_config has been applied. ``alias`` is what OpenSSH is given."""

    hostname: str
    port: int
    user: str
    identity_files: tuple[str, ...]
    known_hosts: Path
    connect_timeout_s: float
    jumps: tuple[Jump, ...] = ()
    alias: str | None = None

    @property
    def known_hosts_name(self) -> str:
        """The host's name as written in known_hosts (OpenSSH's ``[host]:port`` form off port 22)."""
        return known_hosts_name(self.hostname, self.port)


def known_hosts_name(hostname: str, port: int) -> str:
    return hostname if port == 22 else f"[{hostname}]:{port}"


def ssh_config_path() -> Path:
    return Path(os.environ.get(SSH_CONFIG_ENV) or "~/.ssh/config").expanduser()


def _load_ssh_config() -> paramiko.SSHConfig:
    path = ssh_config_path()
    if path.is_file():
        return paramiko.SSHConfig.from_path(str(path))
    return paramiko.SSHConfig.from_text("")


def _parse_jump(spec: str, default_user: str, config: paramiko.SSHConfig) -> Jump:
    """``[user@]host[:port]``, itself looked up in ssh_config (OpenSSH does the same)."""
    user, _, hostport = spec.rpartition("@")
    host, port = hostport, None
    m = re.fullmatch(r"\[([^\]]+)\](?::(\d+))?|([^:]+)(?::(\d+))?", hostport)
    if m:
        host = m.group(1) or m.group(3)
        port = m.group(2) or m.group(4)
    cfg = config.lookup(host)
    return Jump(
        hostname=cfg.get("hostname", host),
        port=int(port or cfg.get("port", 22)),
        user=user or cfg.get("user", default_user),
        identity_files=tuple(os.path.expanduser(p) for p in cfg.get("identityfile", [])),
    )


def resolve_endpoint(host: HostConfig, config: paramiko.SSHConfig | None = None) -> Endpoint:
    """Inventory + ssh_config -> Endpoint. Pure given ``config``.

    With ``ssh_alias``, what ssh_config says for the alias wins (as with plain ``ssh alias``); the inventory fills
    in the rest. Without it, ssh_config is consulted for ProxyJump and IdentityFile of the address only.
    """
    config = config if config is not None else _load_ssh_config()
    identity = (os.path.expanduser(host.identity_file),) if host.identity_file else ()
    known_hosts = Path(os.path.expanduser(host.known_hosts))
    if host.ssh_alias:
        cfg = config.lookup(host.ssh_alias)
        # paramiko reports the alias itself as HostName when the config sets none: then the address wins.
        configured = cfg.get("hostname")
        hostname = configured if configured and configured != host.ssh_alias else (host.address or host.ssh_alias)
        port = int(cfg.get("port", host.port))
        user = cfg.get("user", host.user)
        files = tuple(os.path.expanduser(p) for p in cfg.get("identityfile", []))
        alias: str | None = host.ssh_alias
    else:
        assert host.address is not None  # HostConfig guarantees address or ssh_alias
        cfg = config.lookup(host.address)
        hostname, port, user, files, alias = host.address, host.port, host.user, (), None
        files = tuple(os.path.expanduser(p) for p in cfg.get("identityfile", [])) if not identity else ()
    proxy = cfg.get("proxyjump")
    jumps: tuple[Jump, ...] = ()
    if proxy and proxy.lower() != "none":
        jumps = tuple(_parse_jump(s.strip(), user, config) for s in proxy.split(",") if s.strip())
    return Endpoint(
        hostname=hostname,
        port=port,
        user=user,
        identity_files=identity + files,
        known_hosts=known_hosts,
        connect_timeout_s=host.connect_timeout_s,
        jumps=jumps,
        alias=alias,
    )
