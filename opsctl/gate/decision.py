"""The parity gate of docs/gate.md, as pure decisions over data (no I/O, no clock of its own).

Feed it parity lines, unit observations, SSH outcomes and the time; it answers PENDING until it decides:

* PASS          every TP rank of the unit (``expected_ranks``; when unknown, every rank that printed) has K
                consecutive passing lines;
* FAIL          a failing line on any rank (rel >= fail threshold; or a malformed line: NaN, infinite, negative,
                missing, duplicated or garbled values, no ``tp=``, a rank outside the unit's TP size), a
                failed/stopped unit, or a crash loop (NRestarts risen by more than max_restarts since the restart);
* NODATA        no parity line at all before the deadline, or a TP rank that stayed silent (a FAIL for the
                deployer);
* INCONCLUSIVE  parity lines but no K-pass streak before the deadline (a FAIL for the deployer);
* ERROR         SSH failed ssh_retries+1 times in a row: the gate could not look, which is never a pass; or the
                probe's requests were refused (HTTP 4xx: a wrong endpoint or API key): it could not ask;
* UNPROVEN      nothing drove verify traffic (``traffic`` NONE: the probe disabled on an HTTP server) and no line
                came before the deadline: rolled back but not a verdict on the release (not marked bad).

With the probe (``traffic`` PROBE, docs/gate.md "The probe") the gate also hears the server's readiness and the
probe's waves: a probe request that fails (HTTP 5xx, a timeout, a malformed answer) is a FAIL; probes answered
but a rank without a parity line ``parity_grace_s`` after the first answer is a FAIL naming the rank(s); a
server never ready by the deadline is a FAIL.

Lines that are not evidence are IGNORED, never counted either way: when the gate knows the invocation's token,
a parity line with a missing or different ``token=`` that does not hold the token anywhere (a forgery, or a line
of another run), and the marker inside another message without the token. Each is reported once, with its reason
(``ignored_reason``), by whoever feeds the gate.

A message that holds the invocation's token **anywhere** is the service's own output (only a process that read the
root-only token file can write it): it is a well-formed line with that ``token=`` (judged by its values), a
well-formed shapes or fallback line, or a FAIL, never IGNORED: a parity line glued to another message, a marked
line over the length limit, a logged prompt that quotes the token. A message journalctl left out
(``wire.LEFT_OUT``) fails whatever the token.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..hostdata.facts import UnitObservation
from ..journal.reader import JOURNAL_PREFIX_RE
from ..probe.answers import FailureCause, ProbeTally, Wave
from .lines import MARKER, ParityLine, malformed_line, misplaced_marker, parse_line
from .ownership import MIN_TOKEN_PIECE, cut_token, token_rest_at_start
from .verdicts import (
    NO_TRAFFIC_REASON,
    Judgement,
    LineVerdict,
    Traffic,
    Verdict,
    classify,
    cut_piece,
    ignored_reason,
    is_sound,
    json_float,
    line_problems,
    line_reason,
    line_verdict,
)

if TYPE_CHECKING:
    from ..inventory import GateSettings  # annotations only: the offline commands' --help loads no pydantic


@dataclass
class GateState:
    settings: GateSettings
    started_at: float
    deadline_s: float
    baseline_restarts: int = 0
    expected_ranks: int | None = None
    token: str | None = None
    verdict: Verdict = Verdict.PENDING
    reason: str = ""
    decided_at: float | None = None
    streaks: dict[int | None, int] = field(default_factory=dict)
    counts: dict[LineVerdict, int] = field(default_factory=lambda: dict.fromkeys(LineVerdict, 0))
    last_by_rank: dict[int | None, ParityLine] = field(default_factory=dict)
    worst: ParityLine | None = None
    restarts_seen: int = 0
    ssh_failures_in_a_row: int = 0
    traffic: Traffic = Traffic.SELF
    parity_grace_s: float = 30.0  # PROBE: how long after the first answered probe every rank must have printed
    ready_at: float | None = None  # PROBE: when the server first answered its readiness path with 200
    not_ready: str = ""  # PROBE: the last readiness answer that was not 200 (for the deadline's reason)
    first_answer_at: float | None = None  # PROBE: when the first probe request was answered
    probe: ProbeTally = field(default_factory=ProbeTally)
    # An ERROR caused by the gate's own configuration (every failed probe request refused: a wrong endpoint,
    # prompt or API key): the release is rolled back but not marked bad (traffic.failure_cause).
    config_error: bool = False
    # What cut-short lines left of the token (a line journald split inside its token= value): a later message that
    # begins with one of these is that line's second piece, a FAIL (docs/gate.md "Split lines").
    cut_rests: set[str] = field(default_factory=set)

    @classmethod
    def every_line(
        cls, settings: GateSettings, *, expected_ranks: int | None, token: str | None, deadline_s: float = 1.0
    ) -> GateState:
        """A gate for a finite batch of lines (pre-restart checks, capture replays) that never stops at a PASS: it
        needs no K-pass streak, so a failure after the K-th pass still decides FAIL."""
        never = settings.model_copy(update={"consecutive_passes": 1000})
        return cls(settings=never, started_at=0.0, deadline_s=deadline_s, expected_ranks=expected_ranks, token=token)

    @property
    def decided(self) -> bool:
        return self.verdict is not Verdict.PENDING

    @property
    def lines(self) -> int:
        """Counted parity lines (ignored ones excluded)."""
        return sum(n for lv, n in self.counts.items() if lv is not LineVerdict.IGNORED)

    def conclude(self, now: float) -> None:
        """No more evidence will come (the end of an offline journal): decide as the deadline would."""
        self.tick(max(now, self.started_at + self.deadline_s))

    def _decide(self, verdict: Verdict, reason: str, now: float) -> None:
        if not self.decided:
            self.verdict, self.reason, self.decided_at = verdict, reason, now

    def ignored_reason(self, line: ParityLine) -> str | None:
        """Why this line is not evidence at all (None when it is): a missing or foreign token."""
        return ignored_reason(self, line)

    def problems(self, line: ParityLine) -> tuple[str, ...]:
        """What makes a line malformed here (``verdicts.line_problems``)."""
        return line_problems(self, line)

    def judge_line(self, line: ParityLine) -> LineVerdict:
        """One line's verdict as if the invocation printed it (malformed for this unit -> FAIL, else the thresholds;
        never IGNORED); counts nothing."""
        return LineVerdict.FAIL if self.problems(line) else classify(line, self.settings)

    def count_ignored(self, lines: int) -> None:
        """Count lines the gate ignores, judged elsewhere by the same rule (the offline check's lane)."""
        self.counts[LineVerdict.IGNORED] += lines

    def feed(self, line: ParityLine, now: float) -> LineVerdict:
        """Count one parity line (in journal order). Lines after the decision are classified but change nothing."""
        token = self.token
        lv = line_verdict(self, line.token, line.raw, line.rank, line.rel, sound=is_sound(line), hidden=line.hidden)
        if lv is LineVerdict.IGNORED:
            self.counts[LineVerdict.IGNORED] += 1
            return lv
        if token is not None and line.token != token and not line.hidden:
            if (piece := cut_piece(token, line.token, line.raw)) is not None:
                self.cut_rests.add(token[len(piece) :])
        if self.verdict is not Verdict.PENDING:
            return lv
        self.counts[lv] += 1
        self.last_by_rank[line.rank] = line
        if self.worst is None or _badness(line.rel) >= _badness(self.worst.rel):
            self.worst = line
        where = line.where
        if lv is LineVerdict.FAIL:
            self.streaks[line.rank] = 0
            if problems := self.problems(line):
                reason = f"malformed parity line {where}: {'; '.join(problems)}"
            elif math.isfinite(line.rel):
                reason = f"parity {where} rel={line.rel:.4g} >= fail threshold {self.settings.fail_rel:g}"
            else:
                reason = f"parity {where} is not finite (rel={line.rel})"
            self._decide(Verdict.FAIL, reason, now)
        elif lv is LineVerdict.INCONCLUSIVE:
            self.streaks[line.rank] = 0
        else:
            self.streaks[line.rank] = self.streaks.get(line.rank, 0) + 1
            self._check_pass(now)
        return lv

    def silent_ranks(self) -> list[int]:
        """The unit's TP ranks that have printed no counted parity line yet."""
        if self.expected_ranks is None:
            return []
        return [r for r in range(self.expected_ranks) if r not in self.last_by_rank]

    def _check_pass(self, now: float) -> None:
        k = self.settings.consecutive_passes
        if not self.streaks or any(s < k for s in self.streaks.values()) or self.silent_ranks():
            return
        ranks = [r for r in self.streaks if r is not None]
        who = f" on each of {len(self.streaks)} ranks" if len(ranks) > 1 else ""
        self._decide(
            Verdict.PASS, f"{k} consecutive passing parity lines{who} (rel <= {self.settings.pass_rel:g})", now
        )

    def observe_unit(self, obs: UnitObservation, now: float) -> None:
        self.ssh_failures_in_a_row = 0
        self.restarts_seen = max(0, obs.n_restarts - self.baseline_restarts)
        if self.decided:
            return
        if obs.active_state == "failed" and obs.result == "resources":
            # systemd could not set the process up (a missing EnvironmentFile, WorkingDirectory, User): the host's
            # configuration, not the release, which never ran. Rolled back, not marked bad (issue 47).
            self.config_error = True
            self._decide(
                Verdict.ERROR,
                "the unit could not start: systemd found a resource missing (result=resources: an EnvironmentFile, "
                "the working directory or the user); check service.environment_file and the unit on the host",
                now,
            )
        elif obs.active_state == "failed":
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

    def server_ready(self, now: float) -> None:
        """The server answered its readiness path with 200 (the probe's waves start now)."""
        if self.ready_at is None:
            self.ready_at = now

    def server_not_ready(self, detail: str) -> None:
        self.not_ready = detail

    def probe_wave(self, wave: Wave, now: float) -> None:
        """One wave of probe requests. A request the server could not serve fails the release; one it refused
        (HTTP 4xx) means the probe cannot ask this server, an ERROR, not a verdict on the release."""
        self.probe.add(wave)
        if wave.answered and self.first_answer_at is None:
            self.first_answer_at = now
        failed = wave.failed
        if self.decided or not failed:
            return
        reasons = "; ".join(dict.fromkeys(r.error or r.kind for r in failed))
        n = len(wave.requests)
        if wave.cause is FailureCause.CONFIGURATION:
            self.config_error = True
            self._decide(
                Verdict.ERROR,
                f"probe requests refused: {len(failed)} of {n} ({reasons}); check gate.probe (endpoint, prompts) "
                f"and the API key in service.environment_file"
                + (f" (no API key sent: {wave.auth_error})" if wave.auth_error else ""),
                now,
            )
            return
        self._decide(Verdict.FAIL, f"probe requests failed: {len(failed)} of {n} ({reasons})", now)

    def ssh_failed(self, message: str, now: float) -> None:
        self.ssh_failures_in_a_row += 1
        if self.ssh_failures_in_a_row > self.settings.ssh_retries:
            self._decide(Verdict.ERROR, f"cannot read the host: {message} ({self.ssh_failures_in_a_row} attempts)", now)

    def _silent_for_probe(self) -> list[int] | None:
        """PROBE: the ranks still silent once the grace after the first answered probe is over (None: not yet, or
        no rank is silent)."""
        silent = self.silent_ranks() if self.expected_ranks is not None else ([] if self.lines else [0])
        return silent or None

    def tick(self, now: float) -> None:
        """Apply the deadline (and, with the probe, the grace for parity lines after the first answer)."""
        if self.decided:
            return
        if (
            self.traffic is Traffic.PROBE
            and self.first_answer_at is not None
            and now - self.first_answer_at >= self.parity_grace_s
            and (silent := self._silent_for_probe())
        ):
            ranks = (
                f"TP rank(s) {', '.join(map(str, silent))} of {self.expected_ranks}"
                if self.expected_ranks is not None
                else "the unit"
            )
            ignored = self.counts[LineVerdict.IGNORED]
            self._decide(
                Verdict.FAIL,
                f"probes answered ({self.probe.answered} of {self.probe.sent} requests) but {ranks} printed no "
                f"parity line within {self.parity_grace_s:g}s of the first answer"
                + (f" ({ignored} lines ignored: wrong or missing token)" if ignored else ""),
                now,
            )
            return
        if now - self.started_at < self.deadline_s:
            return
        silent = self.silent_ranks()
        if self.traffic is Traffic.PROBE and self.ready_at is None and self.lines == 0:
            self._decide(
                Verdict.FAIL,
                f"the server was not ready within {self.deadline_s:g}s ({self.not_ready or 'no readiness answer'})",
                now,
            )
            return
        if self.traffic is Traffic.NONE and self.lines == 0 and self.counts[LineVerdict.IGNORED] == 0:
            self._decide(Verdict.UNPROVEN, f"{NO_TRAFFIC_REASON} (no parity line within {self.deadline_s:g}s)", now)
            return
        if self.lines == 0:
            ignored = self.counts[LineVerdict.IGNORED]
            self._decide(
                Verdict.NODATA,
                f"no parity line within {self.deadline_s:g}s"
                + (f" ({ignored} lines ignored: wrong or missing token)" if ignored else ""),
                now,
            )
        elif silent:
            self._decide(
                Verdict.NODATA,
                f"TP rank(s) {', '.join(map(str, silent))} of {self.expected_ranks} printed no parity line "
                f"within {self.deadline_s:g}s",
                now,
            )
        else:
            c = self.counts
            self._decide(
                Verdict.INCONCLUSIVE,
                f"no {self.settings.consecutive_passes} consecutive passes within {self.deadline_s:g}s "
                f"({c[LineVerdict.PASS]} pass, {c[LineVerdict.INCONCLUSIVE]} inconclusive)",
                now,
            )

    def probe_summary(self) -> dict[str, object] | None:
        """PROBE: what the probe saw, and the times from the restart to readiness and from readiness to the
        verdict (seconds)."""
        if self.traffic is not Traffic.PROBE:
            return None
        ready = None if self.ready_at is None else round(self.ready_at - self.started_at, 3)
        to_verdict = (
            None if self.ready_at is None or self.decided_at is None else round(self.decided_at - self.ready_at, 3)
        )
        return {**self.probe.summary(), "ready_after_s": ready, "verdict_after_ready_s": to_verdict}

    def summary(self) -> dict[str, object]:
        """JSON-ready figures for history and status."""
        worst = self.worst
        probe = self.probe_summary()
        doc: dict[str, object] = {
            "verdict": self.verdict,
            "reason": self.reason,
            "lines": self.lines,
            "pass": self.counts[LineVerdict.PASS],
            "fail": self.counts[LineVerdict.FAIL],
            "inconclusive": self.counts[LineVerdict.INCONCLUSIVE],
            "ignored": self.counts[LineVerdict.IGNORED],
            "restarts": self.restarts_seen,
            # False: the unit did not read the token file, so lines were judged without a token (never silent).
            "token_checked": self.token is not None,
            "elapsed_s": round((self.decided_at or self.started_at) - self.started_at, 3),
            "worst": None
            if worst is None
            else {
                "layer": worst.layer,
                "rank": worst.rank,
                "rel": json_float(worst.rel),
                "max_abs_diff": json_float(worst.max_abs_diff),
            },
        }
        if probe is not None:
            doc["probe"] = probe
        return doc


def split_piece_claimed(state: GateState, message: str) -> bool:
    """Whether a piece of a message journald split (``_LINE_BREAK`` set) may be a parity line of the invocation:
    it holds the marker, ``token=``, the token, or a piece of it at either edge. The backend's lines are far
    shorter than journald's LineMax, so such a piece is never one it printed whole: a FAIL."""
    if MARKER in message:
        return True
    own = state.token
    if own is None:
        return False
    if own in message or "token=" in message or token_rest_at_start(message, own, state.cut_rests) is not None:
        return True
    return any(message.endswith(own[:k]) for k in range(MIN_TOKEN_PIECE, len(own)))


def judge(
    state: GateState, message: str, now: float, *, journal_prefix: bool = False, split: str = ""
) -> Judgement | None:
    """One journal message into the gate. None for a message that is not about parity at all. A message holding
    the invocation's token that is not a well-formed line is a malformed line of the invocation: a FAIL.
    ``journal_prefix``: ``message`` is a line of journalctl's text output (``lines.parse_line``). ``split``: the
    entry's ``_LINE_BREAK`` (journald cut the message; JSON only): a piece that holds the marker or any part of
    the token is a FAIL, whatever token it shows, and what it leaves of the token marks the next piece."""
    if split and split_piece_claimed(state, message):
        if state.token is not None and (piece := cut_token(message, state.token)) is not None:
            state.cut_rests.add(state.token[len(piece) :])
        why = (
            f"journald split this message (_LINE_BREAK={split}): a piece of a marked line or of the invocation's "
            "token, never a whole line the backend printed"
        )
        return judge_record(state, malformed_line(message, why, anyones=True), now)
    rec = parse_line(message, journal_prefix=journal_prefix)
    if isinstance(rec, ParityLine):
        return judge_record(state, rec, now)
    if rec is not None:
        return None  # a well-formed shapes or fallback line
    misplaced = misplaced_marker(message, journal_prefix=journal_prefix)
    if state.token is not None and state.token in message:
        why = (
            f"{MARKER} inside another message (glued to it, or quoted), holding the invocation's token"
            if misplaced
            else "the invocation's token in a message that is not a parity line"
        )
        return judge_record(state, malformed_line(message, why), now)
    if state.token is not None and (rest := _rest_at_start(state, message, journal_prefix)) is not None:
        why = (
            f"begins with the last {len(rest)} characters of the invocation's token: the second piece of a line "
            "journald split inside its token"
        )
        return judge_record(state, malformed_line(message, why, anyones=True), now)
    if misplaced:
        return Judgement(LineVerdict.IGNORED, f"{MARKER} inside another message, not a parity line", message)
    return None


def _rest_at_start(state: GateState, message: str, journal_prefix: bool) -> str | None:
    own = state.token
    assert own is not None
    if not state.cut_rests and own[-MIN_TOKEN_PIECE:] not in message:
        return None  # the common case, at the cost of one substring search
    if journal_prefix and (m := JOURNAL_PREFIX_RE.match(message)) is not None:
        message = message[m.end() :]
    return token_rest_at_start(message, own, state.cut_rests)


def judge_record(state: GateState, rec: ParityLine, now: float) -> Judgement:
    """One parsed parity line (or malformed marked line) into the gate."""
    decided = state.decided
    verdict = state.feed(rec, now)
    return Judgement(verdict, line_reason(state, rec, verdict), rec.raw, rec, after_decision=decided)


def _badness(rel: float) -> float:
    """NaN is the worst value of all (it fails the gate)."""
    return math.inf if math.isnan(rel) else rel
