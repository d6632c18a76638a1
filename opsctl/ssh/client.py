"""A live SSH session to one host: ``connect`` opens it (through ProxyJump hops), ``SshSession`` runs commands on it
(it satisfies the ``Remote`` protocol of opsctl.ssh.remote).

    with connect(host) as r:
        r.run(["systemctl", "is-active", host.unit], check=False)
        r.write_file("/etc/x", "data")
        r.rsync(Path("bundle"), "/root/kdtree-engine/releases/abc")

Built on Paramiko (Fabric's transport) with OpenSSH semantics where it matters: where to connect comes from
``endpoint`` (inventory + ssh_config), host keys are checked by ``hostkeys``, rsync's command line is ``transfer``'s.
Every command has a timeout; on timeout every process the command started is killed on the host (they carry a
marker in their environment, so even daemonised children are found) and CommandTimeout is raised.
"""

from __future__ import annotations

import logging
import os
import select
import shlex
import subprocess
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
from .endpoint import KEEPALIVE_S, Endpoint, resolve_endpoint
from .hostkeys import fingerprint, new_client
from .transfer import RsyncStats, openssh_command, parse_rsync_stats, rsync_argv

# Paramiko logs a full traceback (at ERROR, from its transport thread) for an expected failure such as a host that
# closes the connection before its banner. Those failures are raised here as one-line SshErrors; the library's own
# log goes nowhere unless the CLI's --debug turns logging on.
logging.getLogger("paramiko").addHandler(logging.NullHandler())

STDERR_TAIL_LINES = 20
READ_CHUNK = 65536

__all__ = ["CommandResult", "SshSession", "connect"]


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
    client = new_client(ep.known_hosts, name, accept_new)
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
def connect(host: HostConfig, *, accept_new_host_key: bool = False) -> Iterator[SshSession]:
    """Open an SSH session to ``host`` (through its ProxyJump hops, if any) and yield its SshSession."""
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
        yield SshSession(host=host, endpoint=ep, client=client)


# ---------------------------------------------------------------------------------------------- SshSession


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


class _Output:
    """What a running command has printed so far, on each stream, and its lines as they complete (on_output)."""

    def __init__(self, on_output: Callable[[str], None] | None) -> None:
        self.stdout = bytearray()
        self.stderr = bytearray()
        # One splitter per stream, so that a line is never glued from both.
        self._lines_out = _LineSplitter(on_output) if on_output else None
        self._lines_err = _LineSplitter(on_output) if on_output else None

    def drain(self, chan: paramiko.Channel) -> bool:
        """Read all the channel holds now, stdout then stderr; whether anything came."""
        got = False
        while chan.recv_ready():
            got = True
            self._take(chan.recv(READ_CHUNK), self.stdout, self._lines_out)
        while chan.recv_stderr_ready():
            got = True
            self._take(chan.recv_stderr(READ_CHUNK), self.stderr, self._lines_err)
        return got

    @staticmethod
    def _take(data: bytes, into: bytearray, lines: _LineSplitter | None) -> None:
        into += data
        if lines:
            lines.feed(data)

    def flush(self) -> None:
        """Hand on_output the last line of each stream even without its newline."""
        for lines in (self._lines_out, self._lines_err):
            if lines:
                lines.flush()


def _finished(chan: paramiko.Channel) -> bool:
    """The command has exited and both streams are read to their end."""
    return chan.exit_status_ready() and chan.eof_received and not chan.recv_ready() and not chan.recv_stderr_ready()


@dataclass(frozen=True)
class _Started:
    """A command started on the host: what to name it, how to find its processes, when it must have ended."""

    command: str
    run_id: str
    sudo: bool
    limit: float
    start: float

    def remaining(self) -> float:
        return self.limit - (time.monotonic() - self.start)


@dataclass
class _RawResult:
    rc: int
    stdout: bytes
    stderr: bytes
    elapsed_s: float


def _tail(text: str, lines: int = STDERR_TAIL_LINES) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


@dataclass
class SshSession:
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
        transport = self._transport()
        run = _Started(command, uuid.uuid4().hex, self._use_sudo(sudo), limit, time.monotonic())
        chan = self._start(transport, run, stdin)
        output = _Output(on_output)
        try:
            self._wait(chan, transport, run, output)
        finally:
            output.flush()
        rc = chan.recv_exit_status()
        chan.close()
        return _RawResult(
            rc=rc, stdout=bytes(output.stdout), stderr=bytes(output.stderr), elapsed_s=time.monotonic() - run.start
        )

    def _start(self, transport: paramiko.Transport, run: _Started, stdin: str | bytes | None) -> paramiko.Channel:
        """Open a channel, start the wrapped command on it, send ``stdin`` and close the command's input."""
        try:
            chan = transport.open_session(timeout=self.endpoint.connect_timeout_s)
            chan.exec_command(host_session.wrap_command(run.command, run.run_id, run.sudo))
            if stdin is not None:
                chan.sendall(stdin.encode() if isinstance(stdin, str) else stdin)
            chan.shutdown_write()
        except (paramiko.SSHException, OSError, EOFError) as e:
            raise HostUnreachable(self.host.name, f"lost the connection starting `{run.command}`: {e}") from None
        return chan

    def _wait(self, chan: paramiko.Channel, transport: paramiko.Transport, run: _Started, output: _Output) -> None:
        """Collect the command's output until it has exited and said all; past its limit, kill it on the host and
        raise CommandTimeout; a dropped connection raises HostUnreachable."""
        while True:
            remaining = run.remaining()
            if remaining <= 0:
                chan.close()
                self._kill(run.run_id, run.sudo)
                raise CommandTimeout(self.host.name, run.command, run.limit)
            select.select([chan], [], [], min(remaining, 0.5))
            # Only a pass that read nothing may end the wait: output can still arrive after the exit status.
            if not output.drain(chan) and _finished(chan):
                return
            if not transport.is_active():
                raise HostUnreachable(self.host.name, f"connection lost while running `{run.command}`")

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
