"""What a command ends with: a ``DeployVerdict`` (opsctl.host.history, the history's vocabulary) and a
``DeployResult`` for the caller; what ``status`` reads back from the history about the last gated restart."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from ..host.history import DeployVerdict, HistoryEvent, HistoryRecord

if TYPE_CHECKING:
    from .plan import Plan

__all__ = [
    "DeployResult",
    "DeployVerdict",
    "HistoryRecord",
    "NoRollback",
    "RestartTimes",
    "describe_restart_times",
    "last_restart_times",
    "probe_line",
]


class NoRollback(StrEnum):
    """How a rollback ended that had no good release to go back to: no gate ran, so there is no verdict."""

    UNIT_STOPPED = "unit stopped"  # and disabled: nothing a gate passed may run
    AS_BEFORE = "restarted, not gated"  # what served before the deploy, with the unit it ran with (issue 47)


@dataclass
class DeployResult:
    host: str
    action: HistoryEvent  # deploy, restart, rollback, adopt: the event the history records
    release: str | None  # the release that was deployed / restarted / rolled back to
    verdict: DeployVerdict = DeployVerdict.ERROR
    reason: str = ""
    current_after: str | None = None
    rolled_back_to: str | None = None
    rollback_verdict: DeployVerdict | NoRollback | None = None  # after a failed restart: how its rollback ended
    gate: dict[str, Any] | None = None
    step_times: dict[str, float] = field(default_factory=dict)
    bytes_sent: int | None = None
    elapsed_s: float = 0.0
    plan: Plan | None = None
    # The comparison with the release replaced (opsctl/pipeline/comparison.py: samples, the judge's result), or why
    # it was skipped; and the stage a verdict other than the gate's came from ("comparison").
    comparison: dict[str, Any] | None = None
    speed: dict[str, Any] | None = None  # the pre-restart speed check (opsctl/speed/judge.py SpeedJudgement.summary)
    stage: str | None = None

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
        if self.rolled_back_to and self.rollback_verdict is NoRollback.AS_BEFORE:
            s += f"; rolled back to {self.rolled_back_to} (what served before): {self.rollback_verdict}"
        elif self.rolled_back_to:
            s += f"; rolled back to {self.rolled_back_to}: {self.rollback_verdict}"
        elif self.rollback_verdict is NoRollback.UNIT_STOPPED:
            s += "; nothing to roll back to: unit stopped and disabled"
        return s + f" [{self.elapsed_s:.1f}s]"


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


@dataclass(frozen=True)
class RestartTimes:
    """The newest gated restart whose gate probed: its event, release, verdict, time, and the seconds from the
    restart to readiness, from readiness to the verdict and from the restart to the verdict."""

    event: HistoryEvent
    release: str | None
    verdict: DeployVerdict | None
    at: str | None
    ready_after_s: float | None
    verdict_after_ready_s: float | None
    verdict_after_s: float | None


def last_restart_times(history: list[HistoryRecord]) -> RestartTimes | None:
    """The newest gated restart whose gate probed (a deploy, restart or rollback); None when no gate in the history
    probed. Pure (for `opsctl status`)."""
    for rec in reversed(history):
        gate = rec.gate or {}
        probe = gate.get("probe")
        if isinstance(probe, dict):
            return RestartTimes(
                event=rec.event,
                release=rec.release,
                verdict=rec.verdict,
                at=rec.at,
                ready_after_s=_seconds(probe.get("ready_after_s")),
                verdict_after_ready_s=_seconds(probe.get("verdict_after_ready_s")),
                verdict_after_s=_seconds(gate.get("elapsed_s")),
            )
    return None


def _seconds(value: object) -> float | None:
    return value if isinstance(value, int | float) and not isinstance(value, bool) else None


def describe_restart_times(times: RestartTimes, *, with_record: bool = True) -> str:
    """``ready 3.1s after the restart, verdict PASS 0.8s later (4.0s after the restart); deploy r1 at ...``
    (without the record's event, release and time when the caller names them already)."""
    ready, later, total = times.ready_after_s, times.verdict_after_ready_s, times.verdict_after_s
    head = f"ready {ready:.1f}s after the restart" if ready is not None else "never ready"
    verdict = f"verdict {times.verdict}"
    if later is not None:
        verdict += f" {later:.1f}s later"
    if total is not None:
        verdict += f" ({total:.1f}s after the restart)"
    text = f"{head}, {verdict}"
    return f"{text}; {times.event} {times.release} at {times.at}" if with_record else text
