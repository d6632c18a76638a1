"""A Remote that runs commands in a local shell: exercises the real shell snippets of hoststate on a temp dir.

The shell is ``/bin/sh`` (dash on Debian), as on a host, where the SSH layer runs every command with ``sh -c``
(opsctl/ssh/wrap.py): a bash-ism in a command fails here as it would there."""

from __future__ import annotations

import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path

from opsctl.errors import CommandFailed


@dataclass
class Result:
    command: str
    rc: int
    stdout: str
    stderr: str
    elapsed_s: float = 0.0


class LocalRemote:
    def __init__(self) -> None:
        self.commands: list[str] = []

    def run(
        self,
        cmd: str | list[str],
        *,
        timeout: float | None = None,
        check: bool = True,
        stdin: str | bytes | None = None,
        **_: object,
    ) -> Result:
        command = cmd if isinstance(cmd, str) else shlex.join(cmd)
        self.commands.append(command)
        data = stdin.encode() if isinstance(stdin, str) else stdin
        p = subprocess.run(["/bin/sh", "-c", command], input=data, capture_output=True, timeout=timeout or 60)
        res = Result(command, p.returncode, p.stdout.decode(), p.stderr.decode())
        if check and p.returncode != 0:
            raise CommandFailed("local", command, p.returncode, res.stderr)
        return res

    def write_file(self, path: str, data: str | bytes, *, mode: int = 0o644) -> None:
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data.encode() if isinstance(data, str) else data)
        p.chmod(mode)

    def read_file(self, path: str) -> bytes:
        return Path(path).read_bytes()
