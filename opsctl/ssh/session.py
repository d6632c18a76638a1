"""One SSH connection per command that survives drops: ``Session``."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, TypeVar

from ..errors import CommandFailed, CommandTimeout, SshError
from ..inventory import HostConfig
from .remote import Remote

if TYPE_CHECKING:
    from .transfer import RsyncStats

T = TypeVar("T")


class DeployRemote(Remote, Protocol):
    """What the commands need from a session beyond running commands: the upload, and whether it still lives."""

    def rsync(
        self, local_dir: Path, remote_dir: str, *, link_dest: str | None = None, timeout: float | None = None
    ) -> RsyncStats: ...

    @property
    def is_active(self) -> bool: ...


Connect = Callable[[HostConfig], contextlib.AbstractContextManager[DeployRemote]]


def default_connect(host: HostConfig) -> contextlib.AbstractContextManager[DeployRemote]:
    from .client import connect

    return connect(host)


class Session:
    """One SSH connection that is re-opened after a drop (the gate keeps going across reconnects)."""

    def __init__(self, host: HostConfig, connect: Connect = default_connect) -> None:
        self.host = host
        self._connect = connect
        self._stack: contextlib.ExitStack | None = None
        self._remote: DeployRemote | None = None

    @property
    def r(self) -> DeployRemote:
        if self._remote is not None and not getattr(self._remote, "is_active", True):
            self.drop()  # the connection died since the last command: open a new one instead of failing on it
        if self._remote is None:
            stack = contextlib.ExitStack()
            remote = stack.enter_context(self._connect(self.host))
            self._remote, self._stack = remote, stack
            return remote
        return self._remote

    def call(self, fn: Callable[[DeployRemote], T]) -> T:
        """``fn(remote)``, reconnecting and retrying after an SSH drop (up to the host's gate.ssh_retries, with
        backoff). For short idempotent bookkeeping after a decision, so a drop cannot leave the host half-recorded
        and locked; a command that ran and failed (CommandFailed, CommandTimeout) is not retried."""
        delay = 0.5
        for attempt in range(self.host.gate.ssh_retries + 1):
            try:
                return fn(self.r)
            except (CommandFailed, CommandTimeout):
                raise
            except SshError:
                if attempt >= self.host.gate.ssh_retries:
                    raise
                self.drop()
                time.sleep(delay)
                delay = min(delay * 2, 10.0)
        raise AssertionError("unreachable")

    def drop(self) -> None:
        stack, self._stack, self._remote = self._stack, None, None
        if stack is not None:
            with contextlib.suppress(Exception):
                stack.close()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.drop()
