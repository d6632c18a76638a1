"""The one ``Remote`` protocol: what every module that runs commands on a host needs from a session.

``opsctl.ssh.client.SshSession`` (a live SSH session) satisfies it, and so do the tests' local shells; code that only
builds and runs commands depends on this protocol, never on Paramiko.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol


class CommandResultLike(Protocol):
    """What a finished command leaves: its exit status and output (``opsctl.ssh.client.CommandResult``)."""

    @property
    def command(self) -> str: ...
    @property
    def rc(self) -> int: ...
    @property
    def stdout(self) -> str: ...
    @property
    def stderr(self) -> str: ...


class Remote(Protocol):
    """A session on one host: run a command (a list is shlex.join'ed, a string goes to the shell as-is), write
    a file atomically, read one."""

    def run(
        self,
        cmd: str | Sequence[str],
        *,
        timeout: float | None = ...,
        check: bool = ...,
        sudo: bool | None = ...,
        on_output: Callable[[str], None] | None = ...,
        stdin: str | bytes | None = ...,
    ) -> CommandResultLike: ...

    def write_file(self, path: str, data: str | bytes, *, mode: int = 0o644) -> None: ...

    def read_file(self, path: str) -> bytes: ...
