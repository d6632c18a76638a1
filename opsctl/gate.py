"""The parity gate of design.md s.5, as pure decisions over data (no I/O, no clock of its own).

Feed it parity lines, unit observations, SSH outcomes and the time; it answers PENDING until it decides:

* PASS          every rank that printed has K consecutive passing lines (and, when the expected number of TP
                ranks is known and lines name their rank, every rank has printed);
* FAIL          a failing line on any rank (rel >= fail threshold, NaN or infinite), a failed/stopped unit, or a
                crash loop (NRestarts risen by more than max_restarts since the restart);
* NODATA        no parity line at all before the deadline (a FAIL for the deployer);
* INCONCLUSIVE  parity lines but no K-pass streak before the deadline (a FAIL for the deployer);
* ERROR         SSH failed ssh_retries+1 times in a row: the gate could not look, which is never a pass.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum

from .inventory import GateSettings
from .parity import ParityLine


class LineVerdict(StrEnum):
    PASS = "PASS"
    FAIL = "FAIL"
    INCONCLUSIVE = "INCONCLUSIVE"


class Verdict(StrEnum):
    PENDING = "PENDING"
    PASS = "PASS"
    FAIL = "FAIL"
    INCONCLUSIVE = "INCONCLUSIVE"
    NODATA = "NODATA"
    ERROR = "ERROR"

    @property
    def ok(self) -> bool:
        return self is Verdict.PASS


def classify(line: ParityLine, settings: GateSettings) -> LineVerdict:
    """One parity line -> PASS / FAIL / INCONCLUSIVE. Anything not finite fails."""
    if not line.finite or not math.isfinite(line.rel):
        return LineVerdict.FAIL
    if line.rel >= settings.fail_rel:
        return LineVerdict.FAIL
    if line.rel <= settings.pass_rel:
        return LineVerdict.PASS
    return LineVerdict.INCONCLUSIVE


@dataclass(frozen=True)
class UnitObservation:
    """What ``systemctl show`` said about the unit at one poll."""

    active_state: str
    sub_state: str
    n_restarts: int
    invocation_id: str
    result: str = "success"


@dataclass
class GateState:
    settings: GateSettings
    started_at: float
    deadline_s: float
    baseline_restarts: int = 0
    expected_ranks: int | None = None
    verdict: Verdict = Verdict.PENDING
    reason: str = ""
    decided_at: float | None = None
    streaks: dict[int | None, int] = field(default_factory=dict)
    counts: dict[LineVerdict, int] = field(default_factory=lambda: dict.fromkeys(LineVerdict, 0))
    last_by_rank: dict[int | None, ParityLine] = field(default_factory=dict)
    worst: ParityLine | None = None
    restarts_seen: int = 0
    ssh_failures_in_a_row: int = 0
    last_ssh_error: str = ""

    @property
    def decided(self) -> bool:
        return self.verdict is not Verdict.PENDING

    @property
    def lines(self) -> int:
        return sum(self.counts.values())

    def _decide(self, verdict: Verdict, reason: str, now: float) -> None:
        if not self.decided:
            self.verdict, self.reason, self.decided_at = verdict, reason, now

    def feed(self, line: ParityLine, now: float) -> LineVerdict:
        """Count one parity line (in journal order). Lines after the decision are classified but change nothing."""
        lv = classify(line, self.settings)
        if self.decided:
            return lv
        self.counts[lv] += 1
        self.last_by_rank[line.rank] = line
        if self.worst is None or _badness(line.rel) >= _badness(self.worst.rel):
            self.worst = line
        where = f"L{line.layer}" + (f" TP{line.rank}" if line.rank is not None else "")
        if lv is LineVerdict.FAIL:
            self.streaks[line.rank] = 0
            self._decide(
                Verdict.FAIL,
                f"parity {where} rel={line.rel:.4g} >= fail threshold {self.settings.fail_rel:g}"
                if math.isfinite(line.rel)
                else f"parity {where} is not finite (rel={line.rel})",
                now,
            )
        elif lv is LineVerdict.INCONCLUSIVE:
            self.streaks[line.rank] = 0
        else:
            self.streaks[line.rank] = self.streaks.get(line.rank, 0) + 1
            self._check_pass(now)
        return lv

    def _check_pass(self, now: float) -> None:
        k = self.settings.consecutive_passes
        if not self.streaks or any(s < k for s in self.streaks.values()):
            return
        ranks = [r for r in self.streaks if r is not None]
        if self.expected_ranks is not None and ranks and len(ranks) < self.expected_ranks:
            return
        who = f" on each of {len(self.streaks)} ranks" if ranks else ""
        self._decide(
            Verdict.PASS, f"{k} consecutive passing parity lines{who} (rel <= {self.settings.pass_rel:g})", now
        )

    def observe_unit(self, obs: UnitObservation, now: float) -> None:
        self.ssh_failures_in_a_row = 0
        self.restarts_seen = max(0, obs.n_restarts - self.baseline_restarts)
        if self.decided:
            return
        if obs.active_state == "failed":
            self._decide(Verdict.FAIL, f"unit failed (result={obs.result}, restarts={self.restarts_seen})", now)
        elif self.restarts_seen > self.settings.max_restarts:
            self._decide(
                Verdict.FAIL,
                f"crash loop: the unit restarted {self.restarts_seen} times (max {self.settings.max_restarts})",
                now,
            )
        elif obs.active_state == "inactive":
            self._decide(
                Verdict.FAIL, f"unit stopped (state {obs.active_state}/{obs.sub_state}, result={obs.result})", now
            )

    def ssh_failed(self, message: str, now: float) -> None:
        self.ssh_failures_in_a_row += 1
        self.last_ssh_error = message
        if self.ssh_failures_in_a_row > self.settings.ssh_retries:
            self._decide(Verdict.ERROR, f"cannot read the host: {message} ({self.ssh_failures_in_a_row} attempts)", now)

    def tick(self, now: float) -> None:
        """Apply the deadline."""
        if self.decided or now - self.started_at < self.deadline_s:
            return
        if self.lines == 0:
            self._decide(Verdict.NODATA, f"no parity line within {self.deadline_s:g}s", now)
        else:
            c = self.counts
            self._decide(
                Verdict.INCONCLUSIVE,
                f"no {self.settings.consecutive_passes} consecutive passes within {self.deadline_s:g}s "
                f"({c[LineVerdict.PASS]} pass, {c[LineVerdict.INCONCLUSIVE]} inconclusive)",
                now,
            )

    def summary(self) -> dict[str, object]:
        """JSON-ready figures for history and status."""
        worst = self.worst
        return {
            "verdict": str(self.verdict),
            "reason": self.reason,
            "lines": self.lines,
            "pass": self.counts[LineVerdict.PASS],
            "fail": self.counts[LineVerdict.FAIL],
            "inconclusive": self.counts[LineVerdict.INCONCLUSIVE],
            "restarts": self.restarts_seen,
            "elapsed_s": round((self.decided_at or self.started_at) - self.started_at, 3),
            "worst": None
            if worst is None
            else {
                "layer": worst.layer,
                "rank": worst.rank,
                "rel": _json_float(worst.rel),
                "max_abs_diff": _json_float(worst.max_abs_diff),
            },
        }


def _badness(rel: float) -> float:
    """NaN is the worst value of all (it fails the gate)."""
    return math.inf if math.isnan(rel) else rel


def _json_float(x: float) -> float | str:
    return x if math.isfinite(x) else str(x)
