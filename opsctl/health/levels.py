"""What a health run says: a level per check and per host, the host's record, and the exit codes.

Exit codes: 0 when every host is OK, 1 when the worst is WARN, 2 when any host is CRIT (an unreachable host is
CRIT); 3 when the check itself failed (``EXIT_HEALTH_ERROR``). A check that does not apply to a host (no GPU
expected, no HTTP port in replay mode) is ``skip`` and never changes the verdict. The table, JSON and Prometheus
text made of these records are opsctl.cli.render's.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any


class Level(StrEnum):
    OK = "ok"
    WARN = "warn"
    CRIT = "crit"
    SKIP = "skip"

    @property
    def severity(self) -> int:
        """0/1/2 as in the exit codes; a skipped check weighs nothing."""
        return {Level.OK: 0, Level.WARN: 1, Level.CRIT: 2, Level.SKIP: 0}[self]


CHECK_NAMES = ("ssh", "unit", "http", "gpu", "drift", "parity", "disk", "lock", "clock", "probe", "speed")


# `--rollback-on-fail` acts only on evidence that the running release itself is bad (CheckResult.release_bad):
# failing parity lines among the latest of the current invocation, or a crash loop. A stopped unit, a slow HTTP
# endpoint, disk, GPU, lock, drift and clock problems are not fixed by switching releases: a person decides.
@dataclass(frozen=True)
class CheckResult:
    name: str
    level: Level
    detail: str
    value: float | None = None  # the figure the check looked at, for JSON/Prometheus
    release_bad: bool = False  # evidence that the running release is bad: a rollback may act on it


@dataclass(frozen=True)
class HostHealth:
    host: str
    checks: tuple[CheckResult, ...]
    checked_at: float  # local epoch seconds
    elapsed_s: float
    n_restarts: int | None = None
    invocation_id: str | None = None
    release: str | None = None
    # Figures for Prometheus beside the checks' own values: metric name -> value (the speed check's decode seconds
    # per token and accepted drafts, measured now).
    gauges: tuple[tuple[str, float], ...] = ()

    @property
    def level(self) -> Level:
        worst = max((c.level.severity for c in self.checks), default=0)
        return {0: Level.OK, 1: Level.WARN, 2: Level.CRIT}[worst]

    def check(self, name: str) -> CheckResult | None:
        return next((c for c in self.checks if c.name == name), None)

    @property
    def wants_rollback(self) -> bool:
        return any(c.level is Level.CRIT and c.release_bad for c in self.checks)

    def to_dict(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "status": self.level.value,
            "checked_at": self.checked_at,
            "elapsed_s": round(self.elapsed_s, 3),
            "release": self.release,
            "n_restarts": self.n_restarts,
            "invocation_id": self.invocation_id,
            "checks": {c.name: {"status": c.level.value, "detail": c.detail, "value": c.value} for c in self.checks},
            "gauges": dict(self.gauges),
        }


def exit_code(results: Iterable[HostHealth]) -> int:
    return max((r.level.severity for r in results), default=0)


@dataclass(frozen=True)
class HealthRun:
    results: tuple[HostHealth, ...]

    @property
    def exit_code(self) -> int:
        return exit_code(self.results)


# The health check itself failed (bad inventory or option, an alert hook that could not even be tried, a bug):
# none of 0/1/2, which are findings about hosts, so the opsctl-health timer (SuccessExitStatus=1 2) shows it
# as a failed run instead of a CRIT it only reports.
EXIT_HEALTH_ERROR = 3
FINDING_EXIT_CODES = (1, 2)  # WARN, CRIT: a run that found problems, not a failed run (the timer's SuccessExitStatus)
