"""The step runner (opsctl/deploy/runner.py) on a real shell: steps that write into a temp release root, the lock,
the history and the compensation as the runner does them. Each outcome of the runner's docstring once."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from opsctl.errors import CommandFailed, DeployFailed
from opsctl.host import history as host_history
from opsctl.host import releaseroot
from opsctl.inventory import HostConfig
from opsctl.pipeline import DeployVerdict
from opsctl.pipeline.runner import Concluded, Rejected, Run, Step, execute, lock_step
from tests import builders
from tests.pipeline.localremote import LocalRemote

NEW, OLD = "r00000000000b", "r00000000000a"


class Log:
    """A reporter that keeps the step lines in order."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def step(self, name: str, detail: str = "") -> None:
        self.lines.append(f"start {name}")

    def done(self, name: str, detail: str = "") -> None:
        self.lines.append(f"done {name}: {detail}")

    def failed(self, name: str, detail: str = "") -> None:
        self.lines.append(f"failed {name}: {detail}")

    def info(self, message: str) -> None:
        self.lines.append(f"info {message}")

    def parity(self, line: Any, verdict: str) -> None: ...


@pytest.fixture
def host(tmp_path: Path) -> HostConfig:
    return builders.host("h1", gpu_arch=None, root=str(tmp_path / "kdtree-engine"))


@contextlib.contextmanager
def local(_host: HostConfig) -> Iterator[LocalRemote]:
    yield LocalRemote()


def open_run(host: HostConfig, log: Log) -> contextlib.AbstractContextManager[Run]:
    return Run.open(host, "deploy", log, local, release=NEW)


def prepared(host: HostConfig) -> releaseroot.Layout:
    """A managed root with OLD current and NEW uploaded."""
    layout = releaseroot.Layout(host.root)
    r = LocalRemote()
    releaseroot.ensure_layout(r, layout, adopted=False)
    for rid in (OLD, NEW):
        os.makedirs(layout.release(rid))
    releaseroot.switch_current(r, layout, OLD)
    return layout


def steps(done: list[str], fail_at: str | None = None, error: BaseException | None = None) -> list[Step]:
    """snapshot, lock, then a switch to NEW (undone by switching back) and two plain steps."""

    def snapshot(run: Run) -> str:
        run.snap = releaseroot.read_snapshot(run.r, run.host.root, "nonexistent-unit-xyz")
        return f"current {run.snap.current}"

    def switch(run: Run) -> str:
        releaseroot.switch_current(run.r, run.layout, NEW)
        run.switched = True
        return ""

    def switch_back(run: Run) -> None:
        if run.switched and run.previous:
            releaseroot.switch_current(run.r, run.layout, run.previous)
            run.switched = False
        done.append("undo switch")

    def plain(name: str) -> Step:
        def run_(run: Run) -> str:
            done.append(name)
            if name == fail_at and error is not None:
                raise error
            return name

        return Step(name, run_, undo=lambda run: done.append(f"undo {name}"))

    return [
        Step("preflight", snapshot),
        lock_step(lambda run: f"deploy {NEW}"),
        Step("switch", switch, undo=switch_back),
        plain("restart"),
        plain("gate"),
    ]


def test_all_steps_run_in_order_and_the_lock_is_released(host: HostConfig) -> None:
    layout, log, done = prepared(host), Log(), []
    with open_run(host, log) as run:
        run.conclude(DeployVerdict.PASS, "ok")
        result = execute(run, steps(done))
    assert result.verdict is DeployVerdict.PASS and done == ["restart", "gate"]
    assert [x for x in log.lines if x.startswith("done")][:2] == [
        f"done preflight: current {OLD}",
        "done lock: lease 120s, renewed while this run lives",
    ]
    assert os.readlink(layout.current) == f"releases/{NEW}"
    assert not os.path.exists(layout.lock) and set(result.step_times) == {
        "preflight",
        "lock",
        "switch",
        "restart",
        "gate",
    }


def test_a_rejected_release_is_marked_bad_recorded_and_every_started_step_undone_in_reverse(host: HostConfig) -> None:
    layout, log, done = prepared(host), Log(), []
    rejection = Rejected(DeployVerdict.FAIL, "L3 rel=0.9", record_reason="gate FAIL: L3 rel=0.9", gate={"passes": 0})
    with open_run(host, log) as run:
        result = execute(run, steps(done, fail_at="gate", error=rejection))
    assert result.verdict is DeployVerdict.FAIL and result.reason == "L3 rel=0.9"
    assert done == ["restart", "gate", "undo gate", "undo restart", "undo switch"]
    assert "failed gate: L3 rel=0.9" in log.lines
    snap = releaseroot.read_snapshot(LocalRemote(), host.root, "nonexistent-unit-xyz")
    assert snap.current == OLD and snap.bad == {NEW} and not snap.lock_present
    last = host_history.read_history(LocalRemote(), layout)[-1]
    assert (last.event, last.release, last.verdict, last.reason) == (
        "deploy",
        NEW,
        "FAIL",
        "gate FAIL: L3 rel=0.9",
    )
    assert (last.previous, last.current, last.gate) == (OLD, OLD, {"passes": 0})


def test_concluded_ends_the_run_without_undo(host: HostConfig) -> None:
    layout, log, done = prepared(host), Log(), []
    with open_run(host, log) as run:
        result = execute(run, steps(done, fail_at="restart", error=Concluded(DeployVerdict.STAGED, "no restart")))
    # Concluded is raised by the step after its own bookkeeping: here "restart" ran and ended the command.
    assert result.verdict is DeployVerdict.STAGED and done == ["restart"]
    assert os.readlink(layout.current) == f"releases/{NEW}" and not os.path.exists(layout.lock)


def test_an_error_before_the_restart_switches_back_records_and_goes_on(host: HostConfig) -> None:
    layout, log, done = prepared(host), Log(), []
    with open_run(host, log) as run, pytest.raises(DeployFailed, match="build broke"):
        execute(run, steps(done, fail_at="restart", error=DeployFailed("build broke")))
    assert done == ["restart", "undo restart", "undo switch"]
    snap = releaseroot.read_snapshot(LocalRemote(), host.root, "nonexistent-unit-xyz")
    assert snap.current == OLD and snap.bad == set() and not snap.lock_present  # not a verdict on the release
    last = host_history.read_history(LocalRemote(), layout)[-1]
    assert (last.verdict, last.reason) == ("ERROR", "build broke")


def test_an_error_once_restarted_restores_and_ends_in_error_with_the_release_marked_bad(host: HostConfig) -> None:
    prepared(host)
    log, done = Log(), []

    def restarted(run: Run) -> str:
        run.restarted = True
        raise CommandFailed("h1", "systemctl restart x", 255, "connection lost")

    s = steps(done)
    s[3] = Step("restart", restarted, undo=lambda run: done.append("undo restart"))
    with open_run(host, log) as run:
        result = execute(run, s)
    assert result.verdict is DeployVerdict.ERROR and result.reason.endswith("the previous release was restored")
    assert done == ["undo restart", "undo switch"]
    snap = releaseroot.read_snapshot(LocalRemote(), host.root, "nonexistent-unit-xyz")
    assert snap.current == OLD and snap.bad == {NEW} and not snap.lock_present


def test_an_interrupt_restores_records_interrupted_and_goes_on(host: HostConfig) -> None:
    layout, log, done = prepared(host), Log(), []
    with open_run(host, log) as run, pytest.raises(KeyboardInterrupt):
        execute(run, steps(done, fail_at="gate", error=KeyboardInterrupt()))
    assert done == ["restart", "gate", "undo gate", "undo restart", "undo switch"]
    snap = releaseroot.read_snapshot(LocalRemote(), host.root, "nonexistent-unit-xyz")
    assert snap.current == OLD and snap.bad == set() and not snap.lock_present
    assert host_history.read_history(LocalRemote(), layout)[-1].verdict == "INTERRUPTED"


def test_after_the_commit_nothing_is_undone(host: HostConfig) -> None:
    layout, log, done = prepared(host), Log(), []

    def commit_then_fail(run: Run) -> str:
        run.committed = True
        raise DeployFailed("cleanup broke")

    s = steps(done)
    s[4] = Step("gate", commit_then_fail, undo=lambda run: done.append("undo gate"))
    with open_run(host, log) as run, pytest.raises(DeployFailed, match="cleanup broke"):
        execute(run, s)
    assert done == ["restart"]  # the gate's PASS vouched for the release: it stays current
    assert os.readlink(layout.current) == f"releases/{NEW}" and not os.path.exists(layout.lock)


def test_a_failure_before_the_lock_undoes_nothing_and_records_nothing(host: HostConfig) -> None:
    layout, log, done = prepared(host), Log(), []
    before = host_history.read_history(LocalRemote(), layout)

    def refuse(run: Run) -> str:
        raise DeployFailed("refused")

    s = [Step("preflight", refuse), *steps(done)[1:]]
    with open_run(host, log) as run, pytest.raises(DeployFailed, match="refused"):
        execute(run, s)
    assert done == [] and host_history.read_history(LocalRemote(), layout) == before and not os.path.exists(layout.lock)


def test_skipped_and_unshown_steps(host: HostConfig) -> None:
    prepared(host)
    log, done = Log(), []
    s = steps(done)
    s[3] = Step("restart", lambda run: done.append("restart") or "", when=lambda run: False)
    s[4] = Step("record", lambda run: done.append("record") or "", shown=False)
    with open_run(host, log) as run:
        execute(run, s)
    assert done == ["record"]
    assert not [x for x in log.lines if "restart" in x or "record" in x]


def test_an_unproven_release_is_undone_and_recorded_but_not_marked_bad(host: HostConfig) -> None:
    layout, log, done = prepared(host), Log(), []
    reason = "no verify traffic; enable gate.probe or deploy under load"
    rejection = Rejected(DeployVerdict.UNPROVEN, reason, record_reason=f"gate UNPROVEN: {reason}")
    with open_run(host, log) as run:
        result = execute(run, steps(done, fail_at="gate", error=rejection))
    assert result.verdict is DeployVerdict.UNPROVEN and result.verdict.exit_code == 32
    assert done == ["restart", "gate", "undo gate", "undo restart", "undo switch"]
    snap = releaseroot.read_snapshot(LocalRemote(), host.root, "nonexistent-unit-xyz")
    assert snap.current == OLD and snap.bad == set() and not snap.lock_present  # a redeploy is not refused
    last = host_history.read_history(LocalRemote(), layout)[-1]
    assert (last.release, last.verdict, last.reason) == (NEW, "UNPROVEN", f"gate UNPROVEN: {reason}")
