"""The comparison's steps (docs/gate.md "The comparison", docs/pipeline.md): the workload (``gate.compare``) sent to
the running release before ``current`` is switched (the baseline), and to the new one once the gate has PASSed
(the candidate); the two samples judged by opsctl/comparison/compare.py. ``deploy`` and ``restart`` (an A/A check) list
them.

* The baseline is taken only when the comparison is enabled, the unit serves HTTP (not the replay service), a
  restart follows (not ``--no-restart``), the unit is active and its server answers ready, and enough of the
  baseline's requests are answered; otherwise the comparison is skipped and the report says why. A skip is never
  a FAIL of the new release.
* After the gate's PASS the workload runs on the new release: it is recorded (the deploy's sample, which
  ``health --probe`` compares with later) and, with a baseline, judged; without one its requests must still be
  answered. With ``gate.compare.enforce: false`` the verdict is only reported.
* A FAIL on decode speed alone is confirmed before it stands: the workload runs on the new release once more and
  that second sample is judged (opsctl/comparison/compare.py ``confirm``); a busy minute on a shared host does not brand
  a good release, a slower one is slower again.
* What a deploy's and restart's record keep, under ``comparison``: ``{"baseline_release", "outcome", "enforced",
  "line", "reason", "result" (the judge's JSON), "baseline", "candidate" (the samples; with a confirmation also
  "first_candidate")}``, or ``{"skipped": why}``.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..comparison.compare import compare, confirm, judge_alone, min_pairs, needs_another_sample
from ..comparison.results import Outcome
from ..comparison.sample import ComparisonSample
from ..comparison.workload import run_compare_workload
from ..errors import DeployFailed
from ..probe.traffic import ProbeClient, serves_http
from .compareplan import skip_reason
from .result import DeployVerdict
from .runner import Rejected, Run, Step

STAGE = "comparison"
READY_WAIT_S = 10.0  # how long the baseline waits for the running server's readiness before skipping
# The comparison's budget of samples of the new release: the first, and while the verdict is a speed FAIL not yet
# repeated or a withheld slowdown (UNPROVEN), more, at most this many in all (each one side's time: 3-4 s on the
# testbed, 5-18 s in production).
MAX_CANDIDATE_SAMPLES = 3


@dataclass
class ComparisonState:
    """What the baseline step leaves for the comparison step of the same command, and what the two keep as the
    run's ``comparison`` (``record``: see the module's docstring)."""

    baseline: ComparisonSample | None = None
    baseline_release: str | None = None
    skipped: str | None = None
    record: dict[str, Any] | None = None


def _recorded(state: ComparisonState, body: Callable[[Run], str]) -> Callable[[Run], str]:
    """``body`` with the record it left in ``state`` kept as the run's ``comparison``, also when it raises (a
    rejection, the baseline's configuration ERROR): the one place that writes ``run.result.comparison``."""

    def run_(run: Run) -> str:
        try:
            return body(run)
        finally:
            if state.record is not None:
                run.result.comparison = state.record

    return run_


def _ms_per_token(sample: ComparisonSample) -> str:
    times = [r.decode_s_per_token for r in sample.answered if r.decode_s_per_token]
    return f", decode {statistics.median(times) * 1000:.1f} ms/token" if times else ""


def _failures(sample: ComparisonSample) -> str:
    reasons = [f"HTTP {r.status}" if r.status not in (None, 200) else (r.error or "no answer") for r in sample.requests]
    failed = [text for r, text in zip(sample.requests, reasons, strict=True) if not r.ok]
    return "; ".join(dict.fromkeys(t[:80] for t in failed[:8]))


def refused_everything(sample: ComparisonSample) -> bool:
    """Whether the running release refused the whole workload with a 4xx (not 408/429): a wrong or missing API key,
    a workload that does not fit the server. Configuration, not a property of either release. Pure."""
    return bool(sample.requests) and all(r.client_error for r in sample.requests)


def refusal_error(host_name: str, release: str | None, sample: ComparisonSample) -> DeployFailed:
    """The deploy's configuration ERROR when the running release refused the whole baseline (before the switch)."""
    return DeployFailed(
        f"{host_name}: the running release {release or '?'} refused every request of the comparison workload "
        f"({_failures(sample)}) before the switch: a configuration error, nothing was switched or restarted and "
        "nothing marked bad. Check the API key opsctl sends (gate.probe.api_key_env, read on the host from "
        "service.environment_file) against the one the service runs with (if the key changed on the host since "
        f"the service started, `opsctl restart {host_name}` applies it), and that gate.compare fits this server; "
        "or set gate.compare.enabled: false"
    )


def baseline_step(state: ComparisonState, *, refused_is_error: bool = True) -> Step:
    """The workload against the running release, before anything that runs is changed. A deploy
    (``refused_is_error``) stops here with a configuration ERROR (exit 30) when the running release refused the
    whole workload with a 4xx: the new release would meet the same refusal after the restart. ``opsctl restart``
    (False) skips the baseline instead: restarting is how a key changed on the host is applied."""

    def run_(run: Run) -> str:
        host, snap = run.host, run.snap
        why = skip_reason(host, snap, no_restart=run.opts.no_restart)
        sample = None
        if why is None:
            readiness = ProbeClient(host, lambda: run.r).ready(wait_s=READY_WAIT_S)
            if not readiness.ready:
                why = f"the running release is not ready ({readiness.describe(host.gate.probe.ready_path)})"
        if why is None:
            try:
                sample = run_compare_workload(run.r, host, note=run.reporter.info)
            except DeployFailed as e:
                why = f"the workload could not run against the running release: {e.message}"
        if sample is not None and refused_is_error and refused_everything(sample):
            error = refusal_error(host.name, snap.current if snap is not None else None, sample)
            state.record = {
                "baseline_release": snap.current if snap is not None else None,
                "outcome": str(Outcome.ERROR),
                "reason": error.message,
                "baseline": sample.to_json(),
            }
            raise error
        if sample is not None:
            n, answered = len(sample.requests), len(sample.answered)
            if answered < min_pairs(n):
                why = f"the running release answered only {answered} of {n} requests ({_failures(sample)})"
        if why is not None or sample is None:
            state.skipped = why or "no sample"
            state.record = {"skipped": state.skipped}
            return f"skipped: {state.skipped}"
        assert snap is not None and snap.current
        state.baseline, state.baseline_release = sample, snap.current
        return f"{snap.current}: {len(sample.answered)}/{len(sample.requests)} answered{_ms_per_token(sample)}"

    return Step("baseline", _recorded(state, run_))


def _record(
    state: ComparisonState, candidate: ComparisonSample, outcome: Outcome, line: str, reason: str, **extra: Any
) -> dict[str, Any]:
    return {
        "baseline_release": state.baseline_release,
        "outcome": str(outcome),
        "line": line,
        "reason": reason or None,
        "baseline": state.baseline.to_json() if state.baseline is not None else None,
        "candidate": candidate.to_json(),
        "skipped": state.skipped,
        **extra,
    }


def _candidate_sample(run: Run, state: ComparisonState) -> ComparisonSample | str:
    """The workload on the new release -> its sample, or why it could not run (recorded as the FAIL it is)."""
    try:
        return run_compare_workload(run.r, run.host, note=run.reporter.info)
    except DeployFailed as e:
        reason = f"the comparison workload could not run on the new release: {e.message}"
        state.record = {"baseline_release": state.baseline_release, "outcome": "FAIL", "reason": reason}
        return reason


def judge_candidate(run: Run, state: ComparisonState) -> tuple[Outcome, str, str]:
    """Run the workload on the new release and judge it: (outcome, reason, the line to show); the record goes to
    ``state.record``. The workload not running at all on the new release is a FAIL; a FAIL on decode
    speed alone is judged again on a second sample (``confirm``), and a slowdown whose verdict the load or the
    host's contention withheld (UNPROVEN) is measured again within :data:`MAX_CANDIDATE_SAMPLES`: what the last
    sample says stands (UNPROVEN when it is withheld still)."""
    host = run.host
    sample = _candidate_sample(run, state)
    if isinstance(sample, str):
        return Outcome.FAIL, sample, sample
    enforced = host.gate.compare.enforce
    if state.baseline is None:
        outcome, reason = judge_alone(sample)
        line = (
            f"not compared ({state.skipped}); the new release's sample recorded: "
            f"{len(sample.answered)}/{len(sample.requests)} answered{_ms_per_token(sample)}"
        )
        state.record = _record(state, sample, outcome, line, reason, enforced=enforced)
        return outcome, reason, line
    baseline = state.baseline_release or "the baseline"
    result = compare(state.baseline, sample, host.gate.compare, baseline=baseline)
    extra: dict[str, Any] = {}
    samples = 1
    # Measured again after the first sample when its speed FAILs alone or is UNPROVEN; after that only while it is
    # UNPROVEN: a FAIL that repeated (or followed a withheld slowdown) stands.
    while samples < MAX_CANDIDATE_SAMPLES and (
        needs_another_sample(result) if samples == 1 else result.outcome is Outcome.UNPROVEN
    ):
        run.reporter.info(f"comparison: {result.reason}; measuring the new release once more before it stands")
        again = _candidate_sample(run, state)
        if isinstance(again, str):
            return Outcome.FAIL, again, again
        extra.setdefault("first_candidate", sample.to_json())
        judged = compare(state.baseline, again, host.gate.compare, baseline=baseline)
        sample, result = again, confirm(result, judged, earlier=samples)
        samples += 1
    if samples > 1:
        extra["candidate_samples"] = samples
    state.record = _record(
        state, sample, result.outcome, result.line(), result.reason, enforced=enforced, result=result.to_json(), **extra
    )
    return result.outcome, result.reason, result.line()


_VERDICT = {
    Outcome.FAIL: DeployVerdict.FAIL,
    Outcome.ERROR: DeployVerdict.ERROR,
    Outcome.UNPROVEN: DeployVerdict.UNPROVEN,
}


def comparison_step(state: ComparisonState, *, rejects: bool) -> Step:
    """After the gate's PASS: the new release's sample, judged against the baseline. ``rejects`` (deploy): a FAIL
    or ERROR rejects the release (rolled back; ERROR does not mark it bad), and a verdict that stands commits the
    run; otherwise (restart) it becomes the command's verdict."""

    def run_(run: Run) -> str:
        host = run.host
        if not host.gate.compare.enabled or not serves_http(host):
            if rejects:
                run.committed = True
            return f"skipped: {state.skipped}" if state.skipped else "skipped"
        outcome, reason, line = judge_candidate(run, state)
        detail = f"{outcome}: {line}"
        # A restart compares the release with itself: a 4xx on both sides (ERROR) is the workload's, never the
        # release's, so there only a FAIL or UNPROVEN (a slowdown not explained) becomes the verdict.
        if outcome in _VERDICT and host.gate.compare.enforce and (rejects or outcome is not Outcome.ERROR):
            verdict = _VERDICT[outcome]
            run.result.stage = STAGE
            if rejects:
                raise Rejected(
                    verdict,
                    f"comparison: {reason}",
                    record_reason=f"comparison {outcome}: {reason}",
                    gate=run.result.gate,
                    stage=STAGE,
                    detail=detail,
                    # ERROR (4xx on both sides) is the workload's: rolled back, the release not marked bad
                    # (nor is it UNPROVEN, by its verdict).
                    config_error=outcome is Outcome.ERROR,
                )
            run.conclude(verdict, f"comparison: {reason}")
            return detail
        if outcome in _VERDICT:
            why = "not enforced (gate.compare.enforce: false)" if not host.gate.compare.enforce else "not the release's"
            run.reporter.info(f"comparison {outcome} {why}: {reason}")
            detail = f"{outcome} ({why}): {line}"
        if rejects:
            run.committed = True
        return detail

    return Step(STAGE, _recorded(state, run_), when=lambda run: run.result.verdict is DeployVerdict.PASS or rejects)
