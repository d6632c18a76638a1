"""The SSH layer: the only way opsctl reaches a host.

    with connect(host) as r:
        r.run(["systemctl", "is-active", host.unit], check=False)
        r.write_file("/etc/x", "data")
        r.rsync(Path("bundle"), "/root/kdtree-engine/releases/abc")

Built on Paramiko (Fabric's transport) with OpenSSH semantics where it matters:
- host keys are checked against the host's own known_hosts file (inventory ``known_hosts``) only; an unknown key is
  refused with its type and SHA256 fingerprint unless accepting is asked for (``accept_new_host_key=True`` or
  ``host_key_policy: accept-new``), which then appends it to that file; a changed key is always refused;
- ``ssh_alias`` is looked up in the ssh_config file (``$OPSCTL_SSH_CONFIG`` or ``~/.ssh/config``): HostName, Port,
  User, IdentityFile and ProxyJump there win over the inventory;
- every command has a timeout; on timeout every process the command started is killed on the host (they carry a
  marker in their environment, so even daemonised children are found) and CommandTimeout is raised;
- rsync runs OpenSSH with the same endpoint, identity, known_hosts file, StrictHostKeyChecking=yes and ProxyJump.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import os
import re
import select
import shlex
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import paramiko

from ..errors import AuthFailed, CommandFailed, CommandTimeout, HostKeyMismatch, HostKeyUnknown, HostUnreachable
from ..inventory import HostConfig
from . import wrap as host_session

# Paramiko logs a full traceback (at ERROR, from its transport thread) for an expected failure such as a host that
# closes the connection before its banner. Those failures are raised here as one-line SshErrors; the library's own
# log goes nowhere unless the CLI's --debug turns logging on.
logging.getLogger("paramiko").addHandler(logging.NullHandler())

SSH_CONFIG_ENV = "OPSCTL_SSH_CONFIG"
KEEPALIVE_S = 15
STDERR_TAIL_LINES = 20

__all__ = [
    "CommandResult",
    "Endpoint",
    "Remote",
    "RsyncStats",
    "connect",
    "fingerprint",
    "resolve_endpoint",
]


@dataclass(frozen=True)
class CommandResult:
    command: str
    rc: int
    stdout: str
    stderr: str
    elapsed_s: float

    @property
    def ok(self) -> bool:
        return self.rc == 0


@dataclass(frozen=True)
class RsyncStats:
    bytes_sent: int
    files_transferred: int
    elapsed_s: float


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


def fingerprint(key: paramiko.PKey) -> str:
    """OpenSSH's SHA256 fingerprint of a public key (``SHA256:...``, unpadded base64)."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


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


# ---------------------------------------------------------------------------------------------- host keys


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


def _new_client(known_hosts: Path, host_name: str, accept_new: bool) -> paramiko.SSHClient:
    client = paramiko.SSHClient()
    # Only the inventory's known_hosts file counts; no system files, no ~/.ssh/known_hosts unless named.
    if known_hosts.is_file():
        try:
            client.get_host_keys().load(str(known_hosts))
        except (OSError, paramiko.SSHException) as e:
            raise HostKeyUnknown(host_name, f"cannot read known_hosts {known_hosts}: {e}") from e
    client.set_missing_host_key_policy(_HostKeyPolicy(host_name, known_hosts, accept_new))
    return client


# ---------------------------------------------------------------------------------------------- connect


def _open_client(
    name: str,
    hostname: str,
    port: int,
    user: str,
    identity_files: tuple[str, ...],
    ep: Endpoint,
    accept_new: bool,
    sock: paramiko.Channel | None,
) -> paramiko.SSHClient:
    client = _new_client(ep.known_hosts, name, accept_new)
    where = f"{user}@{hostname}:{port}"
    timeout = ep.connect_timeout_s
    try:
        client.connect(
            hostname,
            port=port,
            username=user,
            key_filename=list(identity_files) or None,
            look_for_keys=not identity_files,
            allow_agent=not identity_files,
            timeout=timeout,
            banner_timeout=timeout,
            auth_timeout=timeout,
            channel_timeout=timeout,
            sock=sock,
        )
    except (HostKeyUnknown, HostKeyMismatch):
        client.close()
        raise
    except paramiko.BadHostKeyException as e:
        client.close()
        expected = (
            f"{e.expected_key.get_name()} {fingerprint(e.expected_key)}"
            if e.expected_key is not None
            else "a key of another type"
        )
        raise HostKeyMismatch(
            name,
            f"HOST KEY CHANGED for {e.hostname}: it offered {e.key.get_name()} {fingerprint(e.key)}, "
            f"{ep.known_hosts} has {expected}. Possible man-in-the-middle; if the host was reinstalled, remove "
            f"the old entry (ssh-keygen -R '{e.hostname}' -f {ep.known_hosts}) and reconnect",
        ) from None
    except paramiko.AuthenticationException as e:
        client.close()
        keys = ", ".join(identity_files) or "agent/default keys"
        raise AuthFailed(name, f"authentication as {user} failed on {where} with {keys}: {e}") from None
    except TimeoutError as e:
        client.close()
        raise HostUnreachable(name, f"{where} did not answer within {timeout:g}s ({e or 'timed out'})") from None
    except paramiko.ssh_exception.NoValidConnectionsError as e:
        client.close()
        reasons = "; ".join(sorted({os.strerror(x.errno) if x.errno else str(x) for x in e.errors.values()}))
        raise HostUnreachable(name, f"cannot connect to {where}: {reasons or e}") from None
    except paramiko.SSHException as e:
        client.close()
        if "protocol banner" in str(e):
            raise HostUnreachable(
                name,
                f"ssh to {where} failed: no SSH banner within {timeout:g}s (the connection was accepted, then closed "
                "or left silent: is sshd listening on that port, or is a firewall or proxy in between?)",
            ) from None
        raise HostUnreachable(name, f"ssh to {where} failed: {e}") from None
    except (OSError, EOFError) as e:
        client.close()
        raise HostUnreachable(name, f"cannot connect to {where}: {getattr(e, 'strerror', None) or e}") from None
    transport = client.get_transport()
    if transport is not None:
        transport.set_keepalive(KEEPALIVE_S)
    return client


@contextmanager
def connect(host: HostConfig, *, accept_new_host_key: bool = False) -> Iterator[Remote]:
    """Open an SSH session to ``host`` (through its ProxyJump hops, if any) and yield a Remote."""
    ep = resolve_endpoint(host)
    accept_new = accept_new_host_key or host.host_key_policy == "accept-new"
    with ExitStack() as stack:
        sock: paramiko.Channel | None = None
        for hop in ep.jumps:
            hop_client = _open_client(
                host.name,
                hop.hostname,
                hop.port,
                hop.user,
                hop.identity_files or ep.identity_files,
                ep,
                accept_new,
                sock,
            )
            stack.callback(hop_client.close)
            hop_transport = hop_client.get_transport()
            assert hop_transport is not None
            try:
                sock = hop_transport.open_channel(
                    "direct-tcpip", (ep.hostname, ep.port), ("127.0.0.1", 0), timeout=ep.connect_timeout_s
                )
            except (paramiko.SSHException, OSError) as e:
                raise HostUnreachable(
                    host.name, f"jump host {hop.hostname}:{hop.port} cannot reach {ep.hostname}:{ep.port}: {e}"
                ) from None
        client = _open_client(host.name, ep.hostname, ep.port, ep.user, ep.identity_files, ep, accept_new, sock)
        stack.callback(client.close)
        yield Remote(host=host, endpoint=ep, client=client)


# ---------------------------------------------------------------------------------------------- Remote


class _LineSplitter:
    """Bytes in, complete decoded lines out (for on_output)."""

    def __init__(self, sink: Callable[[str], None]) -> None:
        self.sink = sink
        self.buf = b""

    def feed(self, data: bytes) -> None:
        self.buf += data
        *lines, self.buf = self.buf.split(b"\n")
        for line in lines:
            self.sink(line.rstrip(b"\r").decode("utf-8", "replace"))

    def flush(self) -> None:
        if self.buf:
            self.sink(self.buf.decode("utf-8", "replace"))
            self.buf = b""


@dataclass
class _RawResult:
    rc: int
    stdout: bytes
    stderr: bytes
    elapsed_s: float


def _tail(text: str, lines: int = STDERR_TAIL_LINES) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


@dataclass
class Remote:
    """A live SSH session to one host. Obtain it from ``connect``."""

    host: HostConfig
    endpoint: Endpoint
    client: paramiko.SSHClient

    # -- commands ------------------------------------------------------------------------------------------

    def run(
        self,
        cmd: str | Sequence[str],
        *,
        timeout: float | None = None,
        check: bool = True,
        sudo: bool | None = None,
        on_output: Callable[[str], None] | None = None,
        stdin: str | bytes | None = None,
    ) -> CommandResult:
        """Run ``cmd`` on the host.

        A sequence is shlex.join'ed; a string is passed to the remote shell as-is (quote values with shlex.quote).
        ``on_output`` receives stdout and stderr lines as they arrive. ``timeout`` (default: the host's
        command_timeout_s) ends the command *on the host* and raises CommandTimeout. ``check`` raises CommandFailed
        on a non-zero exit. ``sudo`` (default: user is not root) runs it through ``sudo -n``.
        """
        command = cmd if isinstance(cmd, str) else shlex.join(cmd)
        raw = self._exec(command, timeout=timeout, sudo=sudo, on_output=on_output, stdin=stdin)
        result = CommandResult(
            command=command,
            rc=raw.rc,
            stdout=raw.stdout.decode("utf-8", "replace"),
            stderr=raw.stderr.decode("utf-8", "replace"),
            elapsed_s=raw.elapsed_s,
        )
        if check and result.rc != 0:
            raise CommandFailed(self.host.name, command, result.rc, _tail(result.stderr or result.stdout))
        return result

    def _use_sudo(self, sudo: bool | None) -> bool:
        return (self.endpoint.user != "root") if sudo is None else sudo

    def _exec(
        self,
        command: str,
        *,
        timeout: float | None,
        sudo: bool | None,
        on_output: Callable[[str], None] | None,
        stdin: str | bytes | None,
    ) -> _RawResult:
        limit = self.host.command_timeout_s if timeout is None else timeout
        run_id = uuid.uuid4().hex
        use_sudo = self._use_sudo(sudo)
        transport = self._transport()
        start = time.monotonic()
        try:
            chan = transport.open_session(timeout=self.endpoint.connect_timeout_s)
            chan.exec_command(host_session.wrap_command(command, run_id, use_sudo))
            if stdin is not None:
                chan.sendall(stdin.encode() if isinstance(stdin, str) else stdin)
            chan.shutdown_write()
        except (paramiko.SSHException, OSError, EOFError) as e:
            raise HostUnreachable(self.host.name, f"lost the connection starting `{command}`: {e}") from None

        out, err = bytearray(), bytearray()
        lines_out = _LineSplitter(on_output) if on_output else None
        lines_err = _LineSplitter(on_output) if on_output else None
        try:
            while True:
                remaining = limit - (time.monotonic() - start)
                if remaining <= 0:
                    chan.close()
                    self._kill(run_id, use_sudo)
                    raise CommandTimeout(self.host.name, command, limit)
                select.select([chan], [], [], min(remaining, 0.5))
                got = False
                while chan.recv_ready():
                    data = chan.recv(65536)
                    got = True
                    out += data
                    if lines_out:
                        lines_out.feed(data)
                while chan.recv_stderr_ready():
                    data = chan.recv_stderr(65536)
                    got = True
                    err += data
                    if lines_err:
                        lines_err.feed(data)
                if chan.exit_status_ready() and chan.eof_received and not got:
                    if not chan.recv_ready() and not chan.recv_stderr_ready():
                        break
                if not transport.is_active():
                    raise HostUnreachable(self.host.name, f"connection lost while running `{command}`")
        finally:
            if lines_out:
                lines_out.flush()
            if lines_err:
                lines_err.flush()
        rc = chan.recv_exit_status()
        chan.close()
        return _RawResult(rc=rc, stdout=bytes(out), stderr=bytes(err), elapsed_s=time.monotonic() - start)

    @property
    def is_active(self) -> bool:
        """Whether the SSH connection still looks alive (a dropped one is noticed by Paramiko's reader thread)."""
        transport = self.client.get_transport()
        return transport is not None and transport.is_active()

    def _transport(self) -> paramiko.Transport:
        transport = self.client.get_transport()
        if transport is None or not transport.is_active():
            raise HostUnreachable(self.host.name, "the SSH connection is closed")
        return transport

    def _kill(self, run_id: str, sudo: bool) -> None:
        """Kill every process carrying ``run_id`` in its environment: TERM, then KILL what is left."""
        try:
            self._exec(
                host_session.kill_marked_command(run_id),
                timeout=max(10.0, self.endpoint.connect_timeout_s),
                sudo=sudo,
                on_output=None,
                stdin=None,
            )
        except (CommandTimeout, HostUnreachable):
            # The caller gets CommandTimeout for the original command either way; a host that vanished has no
            # processes left to kill.
            pass

    # -- files ---------------------------------------------------------------------------------------------

    def write_file(self, path: str, data: str | bytes, *, mode: int = 0o644) -> None:
        """Write ``path`` atomically: a temp file beside it, fsync'ed, chmod'ed, then renamed over it."""
        try:
            self.run(
                host_session.atomic_write_command(path, mode), stdin=data if isinstance(data, bytes) else data.encode()
            )
        except CommandFailed as e:  # name the file, not the script
            raise CommandFailed(self.host.name, f"write {path}", e.rc, e.stderr_tail) from None

    def read_file(self, path: str) -> bytes:
        raw = self._exec(host_session.cat_command(path), timeout=None, sudo=None, on_output=None, stdin=None)
        if raw.rc != 0:
            raise CommandFailed(self.host.name, f"cat {path}", raw.rc, _tail(raw.stderr.decode("utf-8", "replace")))
        return raw.stdout

    # -- rsync ---------------------------------------------------------------------------------------------

    def ssh_command(self) -> list[str]:
        """The OpenSSH command line (without the destination) that reaches this host with the same settings."""
        return openssh_command(self.endpoint)

    def rsync(
        self,
        local_dir: Path,
        remote_dir: str,
        *,
        link_dest: str | None = None,
        delete: bool = False,
        exclude: Sequence[str] = (),
        timeout: float | None = None,
    ) -> RsyncStats:
        """Copy the *contents* of ``local_dir`` into ``remote_dir`` (created if missing) with rsync over OpenSSH.

        ``link_dest`` hard-links files unchanged from that remote directory instead of sending them.
        """
        local = Path(local_dir)
        if not local.is_dir():
            raise FileNotFoundError(f"rsync source {local} is not a directory")
        limit = self.host.command_timeout_s if timeout is None else timeout
        argv = rsync_argv(self.endpoint, local, remote_dir, link_dest, delete, exclude, self._use_sudo(None))
        start = time.monotonic()
        shown = f"rsync {local}/ {self.host.name}:{remote_dir}/"
        # Created here rather than with rsync's --mkpath, which older rsyncs on a target do not know.
        self.run(["mkdir", "-p", "--", remote_dir], timeout=limit)
        try:
            proc = subprocess.run(
                argv,
                capture_output=True,
                text=True,
                timeout=limit,
                stdin=subprocess.DEVNULL,
                env={**os.environ, "LC_ALL": "C"},
            )
        except FileNotFoundError:
            raise CommandFailed(
                self.host.name, shown, 127, "rsync/ssh not installed here (apt-get install rsync openssh-client)"
            ) from None
        except subprocess.TimeoutExpired:
            raise CommandTimeout(self.host.name, shown, limit) from None
        elapsed = time.monotonic() - start
        if proc.returncode == 255:
            raise HostUnreachable(self.host.name, f"rsync's ssh failed: {_tail(proc.stderr, 3)}")
        if proc.returncode != 0:
            raise CommandFailed(self.host.name, shown, proc.returncode, _tail(proc.stderr))
        return parse_rsync_stats(proc.stdout, elapsed)


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
    """The rsync command line. Pure: tested without a host."""
    argv = ["rsync", "-a", "--stats", "-e", shlex.join(openssh_command(ep))]
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
