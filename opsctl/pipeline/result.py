"""What a command ends with: a ``DeployVerdict``, a ``DeployResult`` for the caller, a ``HistoryRecord`` for the
host's history."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from ..errors import EXIT_UNPROVEN, DeployFailed, GateFailed

if TYPE_CHECKING:
    from .plan import Plan


class DeployVerdict(StrEnum):
    """How a deploy, restart, rollback or adopt ended.

    Success (exit 0): PASS (gated), UP-TO-DATE (nothing to do), STAGED (--no-restart), PLANNED (--dry-run),
    ADOPTED (recorded as release zero), DONE (an ungated rollback).
    The release failed its parity (exit 31): FAIL, NODATA (no verdict by the deadline), INCONCLUSIVE.
    Not proven either way (exit 32): UNPROVEN (no verify traffic by the deadline, the probe disabled): rolled
    back, but the release is not marked bad and may be deployed again.
    Anything else (exit 30): ERROR (could not do or could not look), REFUSED (--dry-run of a refused deploy),
    INTERRUPTED (a signal; the host was restored first)."""

    PASS = "PASS"
    UP_TO_DATE = "UP-TO-DATE"
    STAGED = "STAGED"
    PLANNED = "PLANNED"
    ADOPTED = "ADOPTED"
    DONE = "DONE"
    FAIL = "FAIL"
    NODATA = "NODATA"
    INCONCLUSIVE = "INCONCLUSIVE"
    ERROR = "ERROR"
    REFUSED = "REFUSED"
    INTERRUPTED = "INTERRUPTED"
    UNPROVEN = "UNPROVEN"

    @property
    def ok(self) -> bool:
        return self in _SUCCESS

    @property
    def marks_bad(self) -> bool:
        """Whether a rejection with this verdict marks the release bad: a verdict on the release, not the lack
        of one (UNPROVEN) or an interruption."""
        return self not in _SUCCESS and self not in (DeployVerdict.UNPROVEN, DeployVerdict.INTERRUPTED)

    @property
    def exit_code(self) -> int:
        """The CLI's exit code for this verdict (the codes are errors.py's)."""
        if self.ok:
            return 0
        if self is DeployVerdict.UNPROVEN:
            return EXIT_UNPROVEN
        return GateFailed.exit_code if self in _PARITY_REJECTED else DeployFailed.exit_code


_SUCCESS = frozenset(
    {
        DeployVerdict.PASS,
        DeployVerdict.UP_TO_DATE,
        DeployVerdict.STAGED,
        DeployVerdict.PLANNED,
        DeployVerdict.ADOPTED,
        DeployVerdict.DONE,
    }
)
_PARITY_REJECTED = frozenset({DeployVerdict.FAIL, DeployVerdict.NODATA, DeployVerdict.INCONCLUSIVE})


@dataclass
class DeployResult:
    host: str
    action: str
    release: str | None  # the release that was deployed / restarted / rolled back to
    verdict: DeployVerdict = DeployVerdict.ERROR
    reason: str = ""
    current_after: str | None = None
    rolled_back_to: str | None = None
    rollback_verdict: str | None = None
    gate: dict[str, Any] | None = None
    step_times: dict[str, float] = field(default_factory=dict)
    bytes_sent: int | None = None
    elapsed_s: float = 0.0
    plan: Plan | None = None

    @property
    def ok(self) -> bool:
        return self.verdict.ok

    def line(self) -> str:
        """The one-line verdict (with what the probe saw, when the gate probed)."""
        s = f"{self.host}: {self.action} {self.release or '-'} -> {self.verdict}"
        if self.reason:
            s += f" ({self.reason})"
        probe = (self.gate or {}).get("probe")
        if isinstance(probe, dict):
            s += f"; probe: {probe_line(probe)}"
        if self.rolled_back_to:
            s += f"; rolled back to {self.rolled_back_to}: {self.rollback_verdict}"
        return s + f" [{self.elapsed_s:.1f}s]"


@dataclass(frozen=True)
class HistoryRecord:
    """One line of ``state/history.jsonl`` (docs/release-layout.md). Fields left None are not written."""

    event: str  # deploy-start, deploy, restart, rollback, adopt
    release: str
    verdict: str | None = None
    reason: str | None = None
    previous: str | None = None  # what was current before
    current: str | None = None  # where `current` points once the event is over
    rolled_back_from: str | None = None  # a rollback: the release it left
    gate: dict[str, Any] | None = None
    stage: str | None = None  # where a deploy stopped, when not at the gate
    by: str | None = None
    commit: str | None = None
    dirty: bool | None = None
    automatic: bool | None = None  # a rollback opsctl did by itself after a failed gate
    forced: bool | None = None
    unit: str | None = None  # adopt: the hand-made unit's path
    files: int | None = None  # adopt: how many files were recorded

    def as_json(self) -> dict[str, Any]:
        doc = {k: v for k, v in asdict(self).items() if v is not None}
        if "rolled_back_from" in doc:
            doc["from"] = doc.pop("rolled_back_from")
        return doc


def probe_line(probe: dict[str, Any]) -> str:
    """``8/8 answered, TTFT median 14 ms, ready 3.1s after the restart, verdict 0.8s later`` from a gate
    summary's ``probe``."""
    text = f"{probe.get('answered', 0)}/{probe.get('sent', 0)} answered"
    if probe.get("failed"):
        text += f", {probe['failed']} failed"
    ttft = probe.get("ttft_ms")
    if isinstance(ttft, dict):
        text += f", TTFT median {ttft.get('median', 0):g} ms"
    ready, verdict = probe.get("ready_after_s"), probe.get("verdict_after_ready_s")
    if not isinstance(ready, int | float):
        return text + ", never ready"
    text += f", ready {ready:.1f}s after the restart"
    return text + (f", verdict {verdict:.1f}s later" if isinstance(verdict, int | float) else "")


def last_restart_times(history: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The newest gated restart whose gate probed (a deploy, restart or rollback): its event, release, verdict,
    time, and the seconds from the restart to readiness and from readiness to the verdict. None when no gate in
    the history probed. Pure (for `opsctl status`)."""
    for rec in reversed(history):
        gate = rec.get("gate")
        probe = gate.get("probe") if isinstance(gate, dict) else None
        if isinstance(probe, dict):
            return {
                "event": rec.get("event"),
                "release": rec.get("release"),
                "verdict": rec.get("verdict"),
                "at": rec.get("at"),
                "ready_after_s": probe.get("ready_after_s"),
                "verdict_after_ready_s": probe.get("verdict_after_ready_s"),
                "verdict_after_s": gate.get("elapsed_s"),
            }
    return None


def describe_restart_times(times: dict[str, Any]) -> str:
    """``ready 3.1s after the restart, verdict PASS 0.8s later (4.0s in all; deploy r1 at ...)``."""
    ready, later, total = times.get("ready_after_s"), times.get("verdict_after_ready_s"), times.get("verdict_after_s")
    head = f"ready {ready:.1f}s after the restart" if isinstance(ready, int | float) else "never ready"
    verdict = f"verdict {times.get('verdict')}"
    if isinstance(later, int | float):
        verdict += f" {later:.1f}s later"
    if isinstance(total, int | float):
        verdict += f" ({total:.1f}s after the restart)"
    return f"{head}, {verdict}; {times.get('event')} {times.get('release')} at {times.get('at')}"
