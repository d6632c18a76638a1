"""The one way opsctl runs a program of its own on a host: ``HostProgram``.

Such a program (the probe traffic and the comparison workload, the health probe, the capture listing) runs on the
host's own python3, standard library only, as ``python3 -``: its text goes on the command's stdin, and so does its
configuration, written into the program's one ``CONFIG_TEXT`` line (``payload``). Nothing of either is in argv,
where ``ps`` shows it and the kernel caps one argument at 128 KiB. The configuration never holds a secret (the API
key is read on the host).

A program may be one module or several of one package: then they are shipped as one text, in the order given, with
their imports of each other left out (``bundle``); each stays an importable module for the tests.
"""

from __future__ import annotations

import ast
import json
import shlex
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any, TypeVar

from ..errors import DeployFailed
from .remote import CommandResultLike, Remote

# The line of a program's last module that ``payload`` replaces with the configuration.
CONFIG_LINE = "CONFIG_TEXT: str | None = None\n"
# The exit status of a program that refused its configuration (it still printed its one JSON document).
EXIT_CONFIG = 2
# How much of a failed program's output a message quotes.
FAILURE_TAIL = 300

T = TypeVar("T")


def _left_out(node: ast.stmt) -> bool:
    """A statement the bundle leaves out: ``from __future__`` (written once at its top) or an import of a sibling
    module (its names are in the same text)."""
    return isinstance(node, ast.ImportFrom) and (node.level > 0 or node.module == "__future__")


def bundle(texts: Sequence[str], names: Sequence[str]) -> str:
    """Modules' texts as one program: ``from __future__ import annotations`` first, then each module without its
    left-out imports (``_left_out``), in order. Pure."""
    parts = [
        f"# opsctl's host program, of {len(names)} modules in this order: {', '.join(names)}\n",
        "from __future__ import annotations\n",
    ]
    for name, text in zip(names, texts, strict=True):
        lines = text.splitlines(keepends=True)
        cut = {
            i
            for node in ast.parse(text).body
            if _left_out(node)
            for i in range(node.lineno - 1, node.end_lineno or node.lineno)
        }
        parts.append(f"\n# ---- {name}\n")
        parts.extend(line for i, line in enumerate(lines) if i not in cut)
    return "".join(parts)


# One build at a time: a fleet roll-out asks for the same program from several threads at once, and CPython 3.11's
# ast.parse in two threads at once can raise "SystemError: AST constructor recursion depth mismatch" (a host of a
# parallel roll-out in CI failed so).
_BUILDING = threading.Lock()


def program_text(package: str, modules: tuple[str, ...]) -> str:
    """The program as shipped: the installed module's own file, or several bundled (``bundle``); built once."""
    with _BUILDING:
        return _built(package, modules)


@cache
def _built(package: str, modules: tuple[str, ...]) -> str:
    texts = [resources.files(package).joinpath(m).read_text(encoding="utf-8") for m in modules]
    return texts[0] if len(texts) == 1 else bundle(texts, modules)


@dataclass(frozen=True)
class HostProgram:
    """A program run on a host: the modules of ``package`` it is made of (its entry last), and how messages name
    it (``what``, e.g. "the probe program")."""

    package: str
    modules: tuple[str, ...]
    what: str

    def text(self) -> str:
        return program_text(self.package, self.modules)

    def payload(self, config: Mapping[str, Any]) -> str:
        """What goes on the command's stdin: the program with its ``CONFIG_TEXT`` line set to the configuration
        (JSON text as a Python string literal: ``json.dumps`` of a string is one, ASCII only)."""
        text = self.text()
        if text.count(CONFIG_LINE) != 1:
            raise AssertionError(f"{self.modules[-1]} must have exactly one CONFIG_TEXT line")
        literal = json.dumps(json.dumps(config, separators=(",", ":")))
        return text.replace(CONFIG_LINE, f"CONFIG_TEXT: str | None = {literal}\n")

    def command(self, python: str = "python3") -> str:
        """The remote command: the program and its configuration come on its stdin (``payload``), nothing in argv."""
        return f"{shlex.quote(python)} -"

    def start(
        self,
        remote: Remote,
        config: Mapping[str, Any],
        *,
        timeout: float,
        python: str = "python3",
        check: bool = False,
    ) -> CommandResultLike:
        """Run it once with ``config`` -> the command's result (``check``: a non-zero exit raises)."""
        return remote.run(self.command(python), stdin=self.payload(config), timeout=timeout, check=check)

    def run(
        self,
        remote: Remote,
        config: Mapping[str, Any],
        *,
        timeout: float,
        where: str,
        read: Callable[[str], T],
        what: str | None = None,
        python: str = "python3",
    ) -> T:
        """Run it once and ``read`` its stdout. DeployFailed, its message starting with ``where`` (the host's
        name), when it could not run (an exit other than 0 and ``EXIT_CONFIG``) or ``read`` raises ValueError."""
        name = what or self.what
        res = self.start(remote, config, timeout=timeout, python=python)
        if res.rc not in (0, EXIT_CONFIG):
            tail = (res.stderr.strip() or res.stdout.strip())[-FAILURE_TAIL:] or "no output"
            raise DeployFailed(f"{where}: {name} failed on the host (exit {res.rc}): {tail}")
        try:
            return read(res.stdout)
        except ValueError as e:
            raise DeployFailed(f"{where}: {name}'s answer is unreadable: {e}") from e
