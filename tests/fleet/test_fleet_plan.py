"""Roll-out planning (pure arithmetic) and execution with fake single-host actions (threads, no hosts)."""

from __future__ import annotations

import threading
import time

import pytest

from opsctl.cli.render import render_report, summary_line
from opsctl.errors import HostUnreachable, OpsError, UsageError
from opsctl.fleet.rollout import (
    HostOutcome,
    Outcome,
    default_canary,
    parse_batch,
    parse_max_fail,
    plan_rollout,
    run_rollout,
)
from opsctl.host.history import DeployVerdict
from opsctl.inventory import HostConfig
from tests.builders import inventory


def hosts(n: int) -> list[HostConfig]:
    return list(inventory([f"h{i}" for i in range(1, n + 1)]).hosts.values())


def names(batch) -> list[str]:  # type: ignore[no-untyped-def]
    return [h.name for h in batch]


@pytest.mark.parametrize(
    ("spec", "remaining", "size"),
    [(None, 7, 7), ("2", 7, 2), (3, 7, 3), ("25%", 7, 2), ("10%", 7, 1), ("100%", 7, 7), ("50%", 1, 1)],
)
def test_parse_batch(spec: str | int | None, remaining: int, size: int) -> None:
    assert parse_batch(spec, remaining) == size


@pytest.mark.parametrize("spec", ["0", "-1", "0%", "120%", "two", "5 %%", ""])
def test_parse_batch_rejects(spec: str) -> None:
    with pytest.raises(UsageError):
        parse_batch(spec, 4)


@pytest.mark.parametrize(
    ("spec", "total", "allowed"),
    [(None, 10, 0), ("0%", 10, 0), ("25%", 10, 2), ("33%", 3, 0), ("34%", 3, 1), ("100%", 4, 4)],
)
def test_parse_max_fail(spec: str | None, total: int, allowed: int) -> None:
    assert parse_max_fail(spec, total) == allowed


def test_plan_canary_then_batches_in_inventory_order() -> None:
    hs = hosts(6)
    plan = plan_rollout(hs, canary="h3", batch="2", max_fail="20%")
    assert plan.canary is not None and plan.canary.name == "h3"
    assert [names(b) for b in plan.batches] == [["h1", "h2"], ["h4", "h5"], ["h6"]]
    assert plan.max_failures == 1
    assert [s for s, _ in plan.stages] == ["canary", "batch 1", "batch 2", "batch 3"]
    assert "canary: h3" in plan.describe()


def test_plan_without_canary_and_percent_batch() -> None:
    plan = plan_rollout(hosts(5), canary=None, batch="40%")
    assert plan.canary is None and [len(b) for b in plan.batches] == [2, 2, 1]
    assert default_canary(hosts(3)) == "h1" and default_canary(hosts(1)) is None


def test_plan_rejects_unknown_canary_and_empty_target() -> None:
    with pytest.raises(UsageError, match="not one of"):
        plan_rollout(hosts(3), canary="nope")
    with pytest.raises(UsageError):
        plan_rollout([])


class FakeFleet:
    """A single-host action with scripted failures that records call order and concurrency."""

    def __init__(  # type: ignore[assignment]
        self,
        failing: set[str] = frozenset(),
        raising: set[str] = frozenset(),
        refusing: set[str] = frozenset(),
        delay: float = 0.0,
    ):
        self.failing, self.raising, self.refusing, self.delay = failing, raising, refusing, delay
        self.calls: list[str] = []
        self.running = 0
        self.max_running = 0
        self._lock = threading.Lock()

    def __call__(self, host: HostConfig) -> HostOutcome:
        with self._lock:
            self.calls.append(host.name)
            self.running += 1
            self.max_running = max(self.max_running, self.running)
        time.sleep(self.delay)
        with self._lock:
            self.running -= 1
        if host.name in self.raising:
            raise HostUnreachable(host.name, "unreachable")
        if host.name in self.refusing:
            raise OpsError(f"{host.name}: lock held")
        if host.name in self.failing:
            return HostOutcome(host.name, Outcome.FAILED, "rOLD", "FAIL", detail="gate FAIL, rolled back")
        return HostOutcome(host.name, Outcome.OK, "rNEW", "PASS")


def test_all_pass_serial_runs_canary_first() -> None:
    act = FakeFleet()
    report = run_rollout(plan_rollout(hosts(4), canary="h2", batch="2"), act)
    assert act.calls[0] == "h2" and sorted(act.calls) == ["h1", "h2", "h3", "h4"]
    assert report.ok and report.exit_code == 0 and act.max_running == 1
    assert [o.host for o in report.outcomes] == ["h2", "h1", "h3", "h4"]


def test_canary_failure_touches_nothing_else_even_with_generous_max_fail() -> None:
    act = FakeFleet(failing={"h1"})
    report = run_rollout(plan_rollout(hosts(4), canary="h1", max_fail="100%"), act, parallel=True)
    assert act.calls == ["h1"]
    assert report.stopped and "canary h1" in report.stopped and report.exit_code == 1
    assert [o.outcome for o in report.outcomes[1:]] == [Outcome.SKIPPED] * 3


def test_max_fail_stops_before_the_next_batch_in_parallel() -> None:
    act = FakeFleet(failing={"h2"}, delay=0.05)
    plan = plan_rollout(hosts(7), canary="h1", batch="3", max_fail="0%")
    report = run_rollout(plan, act, parallel=True)
    assert sorted(act.calls) == ["h1", "h2", "h3", "h4"]  # batch 1 finished as a whole, batch 2 never started
    assert act.max_running == 3
    assert {o.host: o.outcome for o in report.outcomes} == {
        "h1": Outcome.OK, "h2": Outcome.FAILED, "h3": Outcome.OK, "h4": Outcome.OK,
        "h5": Outcome.SKIPPED, "h6": Outcome.SKIPPED, "h7": Outcome.SKIPPED,
    }  # fmt: skip
    assert "max-fail" in (report.stopped or "")


def test_serial_stops_at_once_inside_a_batch() -> None:
    act = FakeFleet(failing={"h2"})
    report = run_rollout(plan_rollout(hosts(4), canary=None, batch="100%"), act)
    assert act.calls == ["h1", "h2"]
    assert report.outcome("h3").outcome is Outcome.SKIPPED


def test_tolerated_failures_continue_but_exit_nonzero() -> None:
    act = FakeFleet(raising={"h3"})
    report = run_rollout(plan_rollout(hosts(4), canary="h1", batch=1, max_fail="25%"), act)
    assert sorted(act.calls) == ["h1", "h2", "h3", "h4"]
    assert report.stopped is None and not report.ok and report.exit_code == 1
    assert report.outcome("h3").outcome is Outcome.ERROR and "unreachable" in report.outcome("h3").detail


def test_parallel_is_faster_than_serial() -> None:
    plan = plan_rollout(hosts(4), canary=None)
    t0 = time.monotonic()
    run_rollout(plan, FakeFleet(delay=0.1), parallel=False)
    serial = time.monotonic() - t0
    t0 = time.monotonic()
    run_rollout(plan, FakeFleet(delay=0.1), parallel=True)
    assert time.monotonic() - t0 < serial / 2


def test_a_refusing_pipeline_is_a_failure_not_an_unknown_state() -> None:
    report = run_rollout(plan_rollout(hosts(2), canary=None, max_fail="100%"), FakeFleet(refusing={"h1"}))
    assert report.outcome("h1").outcome is Outcome.FAILED and "lock held" in report.outcome("h1").detail
    assert report.outcome("h2").outcome is Outcome.OK


def test_a_crashing_action_becomes_an_error_outcome() -> None:
    def boom(h: HostConfig) -> HostOutcome:
        raise RuntimeError("bug")

    report = run_rollout(plan_rollout(hosts(2), canary=None), boom, parallel=True)
    assert all(o.outcome is Outcome.ERROR and "RuntimeError" in o.detail for o in report.outcomes)


def test_report_table_and_summary() -> None:
    from rich.console import Console

    report = run_rollout(plan_rollout(hosts(3), canary="h1"), FakeFleet(failing={"h1"}))
    console = Console(width=200, record=True)
    console.print(render_report(report))
    text = console.export_text()
    assert "skipped" in text and "FAIL" in text and "rOLD" in text
    assert summary_line(report).startswith("roll-out stopped: canary h1")


def test_outcome_from_a_deploy_result_shape() -> None:
    from dataclasses import dataclass

    from opsctl.fleet.rollout import LineReporter, outcome_from_result

    @dataclass
    class Result:  # the fields of opsctl.pipeline.DeployResult that the roll-out reads
        host: str
        verdict: DeployVerdict
        ok: bool
        release: str | None = "rNEW"
        current_after: str | None = None
        rolled_back_to: str | None = None
        rollback_verdict: DeployVerdict | None = None
        reason: str = ""
        elapsed_s: float = 3.0

    good = outcome_from_result(Result("h1", DeployVerdict.PASS, True, current_after="rNEW"))
    assert good.outcome is Outcome.OK and good.release == "rNEW" and good.elapsed_s == 3.0
    bad = outcome_from_result(
        Result(
            "h2",
            DeployVerdict.FAIL,
            False,
            current_after="rOLD",
            rolled_back_to="rOLD",
            rollback_verdict=DeployVerdict.PASS,
            reason="rel 1.08",
        )
    )
    assert bad.outcome is Outcome.FAILED and bad.release == "rOLD"
    assert bad.verdict == "FAIL, rolled back to rOLD: PASS" and bad.detail == "rel 1.08"
    lines: list[str] = []
    rep = LineReporter("h2", lines.append)
    rep.step("upload")
    rep.failed("gate", "FAIL")
    assert lines == ["h2: upload...", "h2: gate FAILED (FAIL)"]
