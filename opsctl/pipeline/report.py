"""Progress of a command's steps: the ``Reporter`` the CLI renders (or tests record), and the step timings."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Protocol

from ..errors import OpsError
from ..gate.decision import LineVerdict
from ..gate.lines import ParityLine


class Reporter(Protocol):
    def step(self, name: str, detail: str = "") -> None: ...
    def done(self, name: str, detail: str = "") -> None: ...
    def failed(self, name: str, detail: str = "") -> None: ...
    def info(self, message: str) -> None: ...
    def parity(self, line: ParityLine, verdict: LineVerdict) -> None: ...


class NullReporter:
    def step(self, name: str, detail: str = "") -> None: ...
    def done(self, name: str, detail: str = "") -> None: ...
    def failed(self, name: str, detail: str = "") -> None: ...
    def info(self, message: str) -> None: ...
    def parity(self, line: ParityLine, verdict: LineVerdict) -> None: ...


class ParityRecorder:
    """Passes everything on to the reporter and keeps the parity lines with their verdicts."""

    def __init__(self, inner: Reporter) -> None:
        self.inner = inner
        self.lines: list[tuple[ParityLine, LineVerdict]] = []

    def step(self, name: str, detail: str = "") -> None:
        self.inner.step(name, detail)

    def done(self, name: str, detail: str = "") -> None:
        self.inner.done(name, detail)

    def failed(self, name: str, detail: str = "") -> None:
        self.inner.failed(name, detail)

    def info(self, message: str) -> None:
        self.inner.info(message)

    def parity(self, line: ParityLine, verdict: LineVerdict) -> None:
        self.lines.append((line, verdict))
        self.inner.parity(line, verdict)


@dataclass
class StepTimer:
    """Wall time per step (for the progress display and the measurements in the notes)."""

    times: dict[str, float] = field(default_factory=dict)

    @contextlib.contextmanager
    def timed(self, reporter: Reporter, name: str, detail: str = "") -> Iterator[dict[str, str]]:
        note: dict[str, str] = {}
        reporter.step(name, detail)
        t = time.monotonic()
        try:
            yield note
        except BaseException as e:
            self.times[name] = self.times.get(name, 0.0) + time.monotonic() - t
            reporter.failed(name, note.get("detail") or short(e))
            raise
        self.times[name] = self.times.get(name, 0.0) + time.monotonic() - t
        reporter.done(name, note.get("detail", ""))


def short(e: BaseException) -> str:
    if isinstance(e, OpsError):
        return e.message
    if isinstance(e, KeyboardInterrupt):
        return "interrupted"
    return f"{type(e).__name__}: {e}"
