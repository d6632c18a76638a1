"""Whose fault a failed probe request is (issue 36 item 6, issue 37's 4xx rule), and what the pipeline does with
it: an ERROR of the gate's own configuration (every request refused, e.g. a wrong API key) rolls back but does not
mark the release bad; an ERROR from a lost connection still does. And the gate's probe never runs past its
deadline and returns to the journal within a poll interval (item 8)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from opsctl.gate.decision import GateState, Traffic, Verdict
from opsctl.host import releaseroot
from opsctl.inventory import GateSettings, HostConfig
from opsctl.pipeline import DeployVerdict, steps
from opsctl.pipeline.runner import Run, Step, execute
from opsctl.pipeline.watch import ProbeDriver
from opsctl.probe.answers import FailureCause, RequestOutcome, Wave, failure_cause, is_client_error
from tests import builders
from tests.pipeline.localremote import LocalRemote
from tests.pipeline.test_runner import NEW, OLD, Log, open_run, prepared
from tests.pipeline.test_runner import steps as runner_steps


@pytest.mark.parametrize(
    ("status", "baseline", "cause"),
    [
        (401, None, FailureCause.CONFIGURATION),  # a wrong key: the gate's configuration
        (404, None, FailureCause.CONFIGURATION),
        (400, 400, FailureCause.CONFIGURATION),  # 4xx on both sides: the workload's, not the release's
        (401, 200, FailureCause.RELEASE),  # the release broke the API the old one served
        (422, 200, FailureCause.RELEASE),
        (408, None, FailureCause.RELEASE),  # too slow
        (429, None, FailureCause.RELEASE),  # too full
        (500, None, FailureCause.RELEASE),
        (503, 200, FailureCause.RELEASE),
        (None, None, FailureCause.RELEASE),  # no answer, a timeout, a malformed stream
    ],
)
def test_failure_cause(status: int | None, baseline: int | None, cause: FailureCause) -> None:
    assert failure_cause(status, baseline) is cause
    assert is_client_error(status) == (status is not None and 400 <= status < 500 and status not in (408, 429))


def refused(n: int = 2, auth_error: str | None = None) -> Wave:
    r = RequestOutcome("opsctl-probe-x-0", False, "http", 401, "HTTP 401: Unauthorized")
    return Wave((r,) * n, auth_error=auth_error)


def probing_gate() -> GateState:
    g = GateState(settings=GateSettings(), started_at=0.0, deadline_s=60.0, expected_ranks=1, traffic=Traffic.PROBE)
    g.server_ready(1.0)
    return g


def test_a_wave_refused_on_every_request_is_a_configuration_error_naming_why_no_key_was_sent() -> None:
    g = probing_gate()
    g.probe_wave(refused(auth_error="cannot read /etc/k.env: Permission denied"), 2.0)
    assert g.verdict is Verdict.ERROR and g.config_error
    assert "no API key sent: cannot read /etc/k.env: Permission denied" in g.reason
    mixed = Wave((*refused(1).requests, RequestOutcome("r1", False, "http", 500, "HTTP 500: boom")))
    assert mixed.cause is FailureCause.RELEASE and refused().cause is FailureCause.CONFIGURATION
    g2 = probing_gate()
    g2.probe_wave(mixed, 2.0)
    assert g2.verdict is Verdict.FAIL and not g2.config_error


def _deploy_with_gate(host: HostConfig, gate: GateState, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, set[str]]:
    def fake_gate_step() -> Step:
        def run_(run: Run) -> str:
            run.gate = gate
            run.result.gate = gate.summary()
            run.conclude(DeployVerdict.from_gate(gate.verdict), gate.reason)
            return gate.reason

        return Step("gate", run_)

    monkeypatch.setattr(steps, "gate_step", fake_gate_step)
    prepared(host)
    done: list[str] = []
    plan = runner_steps(done)
    plan[-1] = steps.gate_or_reject_step()
    with open_run(host, Log()) as run:
        result = execute(run, plan)
    snap = releaseroot.read_snapshot(LocalRemote(), host.root, "nonexistent-unit-xyz")
    assert snap.current == OLD  # rolled back either way
    return result, snap.bad


def test_a_configuration_error_rolls_back_but_does_not_mark_the_release_bad(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Today: every probe got 401 (a wrong key variable), ERROR, and the release was marked bad and refused."""
    host = builders.host("h1", gpu_arch=None, root=str(tmp_path / "kdtree-engine"))
    g = probing_gate()
    g.probe_wave(refused(), 2.0)
    result, bad = _deploy_with_gate(host, g, monkeypatch)
    assert result.verdict is DeployVerdict.ERROR and bad == set()


def test_an_error_from_a_lost_connection_still_marks_the_release_bad(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    host = builders.host("h1", gpu_arch=None, root=str(tmp_path / "kdtree-engine"))
    g = probing_gate()
    for _ in range(g.settings.ssh_retries + 1):
        g.ssh_failed("connection reset", 2.0)
    assert g.verdict is Verdict.ERROR and not g.config_error
    result, bad = _deploy_with_gate(host, g, monkeypatch)
    assert result.verdict is DeployVerdict.ERROR and bad == {NEW}


# ------------------------------------------------------------------------------------------------ item 8


class FakeClient:
    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def wave(self, **kw: Any) -> Wave:
        self.calls.append(kw)
        return Wave(())


def test_the_probe_wave_is_bounded_by_the_deadline_and_the_poll_interval() -> None:
    """`requests: 256, concurrency: 1, timeout_s: 3600` made a wave of 10.7 days with no poll in between."""
    host = builders.host(
        "h1",
        gpu_arch=None,
        gate={"poll_interval_s": 5, "probe": {"requests": 256, "concurrency": 1, "timeout_s": 3600}},
    )
    state = GateState(settings=host.gate, started_at=100.0, deadline_s=60.0, traffic=Traffic.PROBE)
    state.server_ready(101.0)
    driver = ProbeDriver(object(), host, state, Log())  # type: ignore[arg-type]
    fake = FakeClient()
    driver.client = fake  # type: ignore[assignment]
    driver.step(lambda: 150.0)
    assert fake.calls == [{"start_within_s": 5.0, "finish_within_s": 10.0}]
    assert driver.step(lambda: 160.0) is None and len(fake.calls) == 1  # the deadline has come: no wave at all
