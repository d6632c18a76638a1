"""Progress of a command's steps: the ``Reporter`` the CLI renders (or tests record), and the step timings.

Besides its five methods, a reporter may have a sixth, ``gate(progress: GateProgress)``: the gate loop calls it
after every poll (``show_gate``), for a live view of the gate (deadline left, what the probe saw). Reporters
without it hear the gate through its lines and ``info`` messages, as before. The ``info`` messages that are
events of the gate start with the prefixes below, so a display can tell them apart (``info_kind``)."""

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


# The prefixes of the gate's ``info`` events (watch.py writes them, a display sorts them by ``info_kind``).
INFO_PROBE_WAVE = "probe wave "  # one wave of probe requests: sent, answered, TTFT
INFO_READY = "probe: the server is ready"  # readiness, once
INFO_PROBE_SUMMARY = "probe: "  # what the probe saw in all, after the verdict (and other probe notes)
INFO_IGNORED = "ignored "  # a marked line that is not evidence (no or wrong token)
INFO_SSH = "SSH trouble"  # a poll that failed; the gate retries from its cursor


def info_kind(message: str) -> str:
    """Which of the gate's events an ``info`` message is: ``probe-wave``, ``ready``, ``probe``, ``ignored``,
    ``ssh``, else ``note``. Pure."""
    for prefix, kind in (
        (INFO_PROBE_WAVE, "probe-wave"),
        (INFO_READY, "ready"),
        (INFO_PROBE_SUMMARY, "probe"),
        (INFO_IGNORED, "ignored"),
        (INFO_SSH, "ssh"),
    ):
        if message.startswith(prefix):
            return kind
    return "note"


@dataclass(frozen=True)
class GateProgress:
    """The gate between two polls, for a live view: the deadline left and what the probe saw so far."""

    deadline_left_s: float
    expected_ranks: int | None  # the unit's TP size (None: every rank that prints)
    consecutive_passes: int  # K: passes in a row each rank needs
    probing: bool  # the gate sends its own probe requests (gate.probe)
    ready: bool  # the server answered its readiness path (always True without the probe)
    sent: int = 0
    answered: int = 0
    failed: int = 0
    waves: int = 0
    ttft_ms: tuple[float, float] | None = None  # the newest wave's fastest and slowest first token
    verdict: str = "PENDING"  # the gate's Verdict, PENDING until it decides


def show_gate(reporter: object, progress: GateProgress) -> None:
    """Hand ``progress`` to a reporter that draws the gate live (has ``gate``); the others need nothing."""
    hook = getattr(reporter, "gate", None)
    if callable(hook):
        hook(progress)


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

    def gate(self, progress: GateProgress) -> None:
        show_gate(self.inner, progress)


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
