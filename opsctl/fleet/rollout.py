"""Fleet roll-outs: a canary first, then batches, stopping when failures cross max-fail.

``plan_rollout`` is pure arithmetic over host lists; ``run_rollout`` executes a plan with any single-host action
(deploy, rollback, restart) and never touches a host after the roll-out stopped. The single-host action owns its
own safety: a deploy whose gate fails rolls that host back by itself and returns a failed ``HostOutcome``; this
module only decides whether to go on.

Rules (the shape of Ansible's ``serial``/``max_fail_percentage`` and Argo Rollouts' canary step):
- the canary runs alone; if it fails, the roll-out stops and nothing else is touched, whatever max-fail says;
- the other hosts go in batches of N hosts or P% of them (at least one host per batch); with ``parallel`` the
  hosts of a batch run at the same time (a thread each), otherwise one after another;
- max-fail P% allows floor(P% x all hosts) failures; one more stops the roll-out after the batch in flight
  (hosts already running are never interrupted: each finishes its own pipeline, rollback included);
- hosts never started are reported ``skipped``;
- a host whose gate was UNPROVEN (no verify traffic: the probe disabled on an idle host) rolled itself back but
  its release was not found bad: it does not count against max-fail, yet the roll-out is not a success, and an
  UNPROVEN canary stops it (nothing has proven the release).
"""

from __future__ import annotations

import functools
import math
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING

from ..errors import OpsError, SshError, UsageError
from ..gate.decision import LineVerdict
from ..host.history import DeployVerdict
from ..inventory import HostConfig
from .fanout import run_on_hosts

if TYPE_CHECKING:
    # Types only: planning a roll-out and reporting on it run without importing the pipeline.
    from ..pipeline import DeployResult

_COUNT_RE = re.compile(r"^\s*(\d+)\s*$")
_PERCENT_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*%\s*$")


class Outcome(StrEnum):
    OK = "ok"  # the action succeeded (deploy gated PASS, rollback done)
    FAILED = "failed"  # the action failed; the host handled its own recovery (e.g. rolled back)
    ERROR = "error"  # the host was unreachable or dropped out, or the action crashed: its state is unknown
    UNPROVEN = "unproven"  # rolled back for lack of verify traffic; not a failure of the release (max-fail)
    SKIPPED = "skipped"  # never started because the roll-out stopped


@dataclass(frozen=True)
class HostOutcome:
    host: str
    outcome: Outcome
    release: str | None = None  # the release current on the host afterwards, when known
    verdict: str | None = None  # gate verdict (PASS/FAIL/...) or a short word for other actions
    elapsed_s: float = 0.0
    detail: str = ""

    @property
    def failed(self) -> bool:
        return self.outcome in (Outcome.FAILED, Outcome.ERROR)


@dataclass(frozen=True)
class RolloutPlan:
    canary: HostConfig | None
    batches: tuple[tuple[HostConfig, ...], ...]
    max_failures: int  # failures tolerated; one more stops the roll-out
    total: int

    @property
    def stages(self) -> tuple[tuple[str, tuple[HostConfig, ...]], ...]:
        """("canary", (host,)), ("batch 1", ...), ... in execution order."""
        out: list[tuple[str, tuple[HostConfig, ...]]] = []
        if self.canary is not None:
            out.append(("canary", (self.canary,)))
        out.extend((f"batch {i}", b) for i, b in enumerate(self.batches, 1))
        return tuple(out)

    def describe(self) -> str:
        parts = [f"{name}: {', '.join(h.name for h in hosts)}" for name, hosts in self.stages]
        return "; ".join(parts) + f" (stop after {self.max_failures + 1} failure(s))"


def parse_batch(spec: str | int | None, remaining: int) -> int:
    """--batch N or P% -> hosts per batch (>= 1). None means everything at once."""
    if remaining <= 0:
        return 1
    if spec is None:
        return remaining
    if isinstance(spec, int):
        if spec < 1:
            raise UsageError(f"--batch {spec}: a batch needs at least one host")
        return spec
    if m := _COUNT_RE.match(spec):
        n = int(m.group(1))
        if n < 1:
            raise UsageError(f"--batch {spec!r}: a batch needs at least one host")
        return n
    if m := _PERCENT_RE.match(spec):
        p = float(m.group(1))
        if not 0 < p <= 100:
            raise UsageError(f"--batch {spec!r}: a percentage must be in (0, 100]")
        return max(1, math.ceil(remaining * p / 100 - 1e-9))
    raise UsageError(f"--batch {spec!r}: expected a host count like 2 or a percentage like 25%")


def parse_max_fail(spec: str | float | None, total: int) -> int:
    """--max-fail P% (or a bare number of percent) -> failures tolerated. None/0% tolerates none."""
    if spec is None:
        return 0
    if isinstance(spec, int | float):
        p = float(spec)
    elif m := _PERCENT_RE.match(spec) or _COUNT_RE.match(spec):
        p = float(m.group(1))
    else:
        raise UsageError(f"--max-fail {spec!r}: expected a percentage like 25%")
    if not 0 <= p <= 100:
        raise UsageError(f"--max-fail {spec!r}: a percentage must be in [0, 100]")
    return math.floor(total * p / 100 + 1e-9)


def default_canary(hosts: Sequence[HostConfig]) -> str | None:
    """The first host of the group in inventory order, when there is more than one host."""
    return hosts[0].name if len(hosts) > 1 else None


def plan_rollout(
    hosts: Sequence[HostConfig],
    *,
    canary: str | None = None,
    batch: str | int | None = None,
    max_fail: str | float | None = None,
) -> RolloutPlan:
    """Pure: order hosts into a canary and batches. ``canary=None`` means no canary stage."""
    if not hosts:
        raise UsageError("nothing to roll out: the target has no hosts")
    names = [h.name for h in hosts]
    if len(set(names)) != len(names):
        raise UsageError(
            f"a host appears twice in the target: {', '.join(sorted({n for n in names if names.count(n) > 1}))}"
        )
    canary_host = None
    rest = list(hosts)
    if canary is not None:
        canary_host = next((h for h in hosts if h.name == canary), None)
        if canary_host is None:
            raise UsageError(f"--canary {canary!r} is not one of the target's hosts ({', '.join(names)})")
        rest = [h for h in hosts if h.name != canary]
    size = parse_batch(batch, len(rest))
    batches = tuple(tuple(rest[i : i + size]) for i in range(0, len(rest), size))
    return RolloutPlan(canary_host, batches, parse_max_fail(max_fail, len(hosts)), len(hosts))


@dataclass
class RolloutReport:
    outcomes: list[HostOutcome] = field(default_factory=list)
    stopped: str | None = None  # why the roll-out stopped early, None when it ran to the end
    elapsed_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.stopped is None and not any(o.failed or o.outcome is Outcome.UNPROVEN for o in self.outcomes)

    @property
    def failures(self) -> list[HostOutcome]:
        return [o for o in self.outcomes if o.failed]

    def outcome(self, host: str) -> HostOutcome:
        return next(o for o in self.outcomes if o.host == host)

    @property
    def exit_code(self) -> int:
        return 0 if self.ok else 1


Action = Callable[[HostConfig], HostOutcome]
Progress = Callable[[str], None]


def _safe(action: Action, host: HostConfig) -> HostOutcome:
    t0 = time.monotonic()
    try:
        result = action(host)
    except SshError as e:  # the host could not be reached or dropped out: its state is unknown to us
        return HostOutcome(host.name, Outcome.ERROR, elapsed_s=time.monotonic() - t0, detail=e.message)
    except OpsError as e:  # the pipeline refused or stopped cleanly (build failed, lock held, parity failed)
        return HostOutcome(host.name, Outcome.FAILED, elapsed_s=time.monotonic() - t0, detail=e.message)
    except Exception as e:  # a bug in one host's pipeline must not lose the other hosts' outcomes
        return HostOutcome(host.name, Outcome.ERROR, elapsed_s=time.monotonic() - t0, detail=f"{type(e).__name__}: {e}")
    if result.elapsed_s == 0.0:
        result = HostOutcome(
            result.host, result.outcome, result.release, result.verdict, time.monotonic() - t0, result.detail
        )
    return result


def run_rollout(
    plan: RolloutPlan,
    action: Action,
    *,
    parallel: bool = False,
    progress: Progress = lambda _msg: None,
    max_workers: int = 32,
) -> RolloutReport:
    """Execute ``plan`` with ``action`` per host; outcomes come back in plan order."""
    t0 = time.monotonic()
    done: dict[str, HostOutcome] = {}

    def record(o: HostOutcome) -> None:  # always on this thread: run_on_hosts hands results back here
        done[o.host] = o
        progress(f"{o.host}: {o.outcome.value}" + (f" ({o.verdict})" if o.verdict else "") + f" in {o.elapsed_s:.1f}s")

    stopped = None
    for stage, hosts in plan.stages:
        progress(f"{stage}: {', '.join(h.name for h in hosts)}")
        # Serial: a batch stops at once when the failures cross max-fail, the rest of it stays untouched (the
        # canary runs alone: no budget).
        budget = None if stage == "canary" else plan.max_failures
        _run_stage(
            hosts,
            lambda h: _safe(action, h),
            record,
            parallel=parallel,
            max_workers=max_workers,
            stop=functools.partial(_over_budget, done, budget),
        )
        stopped = _stop_reason(stage, hosts, done, plan.max_failures)
        if stopped:
            break
    outcomes = [
        done.get(h.name) or HostOutcome(h.name, Outcome.SKIPPED, detail="not started: roll-out stopped")
        for _, hosts in plan.stages
        for h in hosts
    ]
    return RolloutReport(outcomes, stopped, time.monotonic() - t0)


def _run_stage(
    hosts: Sequence[HostConfig],
    run_one: Action,
    record: Callable[[HostOutcome], None],
    *,
    parallel: bool,
    max_workers: int,
    stop: Callable[[], bool],
) -> None:
    """One stage's hosts: side by side (each finishes its own pipeline), or one after another until ``stop``."""
    if parallel and len(hosts) > 1:
        # run_one turns every failure into an outcome (_safe), so each HostResult holds a value.
        run_on_hosts(
            hosts,
            run_one,
            workers=max_workers,
            on_result=lambda result: record(result.unwrap()),
            thread_name_prefix="rollout",
        )
        return
    for h in hosts:
        record(run_one(h))
        if stop():
            break


def _failures(done: dict[str, HostOutcome]) -> int:
    return sum(1 for o in done.values() if o.failed)


def _over_budget(done: dict[str, HostOutcome], budget: int | None) -> bool:
    return budget is not None and _failures(done) > budget


def _stop_reason(
    stage: str, hosts: Sequence[HostConfig], done: dict[str, HostOutcome], max_failures: int
) -> str | None:
    """Why the roll-out stops after this stage (None: it goes on). A failed or UNPROVEN canary stops it whatever
    max-fail says: nothing has proven the release."""
    canary = done.get(hosts[0].name) if stage == "canary" else None
    if canary is not None and _failures(done):
        return f"canary {canary.host} failed: {canary.detail or 'see above'}"
    if canary is not None and canary.outcome is Outcome.UNPROVEN:
        return f"canary {canary.host} UNPROVEN: {canary.detail or 'no verify traffic'}"
    if _failures(done) > max_failures:
        return f"{_failures(done)} host(s) failed, more than max-fail allows ({max_failures})"
    return None


# ------------------------------------------------------------------------------------------------------------
# Adapters from the single-host pipeline (opsctl.pipeline) to roll-out actions. Imported lazily: planning and the
# report need no SSH stack.


class LineReporter:
    """A deploy Reporter for hosts running side by side: one prefixed line per event instead of a live display."""

    def __init__(self, host: str, emit: Progress) -> None:
        self.host = host
        self.emit = emit

    def step(self, name: str, detail: str = "") -> None:
        self.emit(f"{self.host}: {name}..." + (f" {detail}" if detail else ""))

    def done(self, name: str, detail: str = "") -> None:
        self.emit(f"{self.host}: {name} done" + (f" ({detail})" if detail else ""))

    def failed(self, name: str, detail: str = "") -> None:
        self.emit(f"{self.host}: {name} FAILED" + (f" ({detail})" if detail else ""))

    def info(self, message: str) -> None:
        self.emit(f"{self.host}: {message}")

    def parity(self, line: object, verdict: LineVerdict) -> None:
        layer = getattr(line, "layer", "?")
        rel = getattr(line, "rel", float("nan"))
        self.emit(f"{self.host}: parity L{layer} rel={rel:.3g} {verdict}")


def outcome_from_result(result: DeployResult) -> HostOutcome:
    """A single-host command's DeployResult -> the roll-out's HostOutcome."""
    verdict = str(result.verdict)
    if result.rolled_back_to:
        verdict += f", rolled back to {result.rolled_back_to}: {result.rollback_verdict or '?'}"
    return HostOutcome(
        host=result.host,
        outcome=_outcome_of(result),
        release=result.current_after or result.release,
        verdict=verdict,
        elapsed_s=result.elapsed_s,
        detail=result.reason,
    )


def _outcome_of(result: DeployResult) -> Outcome:
    if result.ok:
        return Outcome.OK
    # No verify traffic is no verdict on the release: it does not count against max-fail.
    return Outcome.UNPROVEN if result.verdict is DeployVerdict.UNPROVEN else Outcome.FAILED


def deploy_action(src: object, opts: object, emit: Progress, **kwargs: object) -> Action:
    """Action deploying ``src`` with ``opts`` (opsctl.pipeline.DeployOptions) to one host; kwargs go to deploy()."""
    from .. import pipeline

    def act(host: HostConfig) -> HostOutcome:
        return outcome_from_result(pipeline.deploy(host, src, opts, LineReporter(host.name, emit), **kwargs))  # type: ignore[arg-type]

    return act


def rollback_action(emit: Progress, **kwargs: object) -> Action:
    """Action rolling one host back (kwargs go to opsctl.pipeline.rollback: to, force, gate, gate_timeout_s)."""
    from .. import pipeline

    def act(host: HostConfig) -> HostOutcome:
        return outcome_from_result(pipeline.rollback(host, LineReporter(host.name, emit), **kwargs))  # type: ignore[arg-type]

    return act
