"""Faults against the gate's promise and against a half-done deploy (docs/gate.md, docs/pipeline.md): forged and
wrong-token lines, a silent TP rank, an SSH cut during the restart, SIGTERM during the gate (and a second one
during the restore), a lost reply to the lock, an expired lease, and health's rollback on weak evidence.
Every scenario asserts each touched host's end state: one release, current and running; the lock free; the
history telling what happened."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from opsctl import pipeline
from opsctl.errors import HostUnreachable
from opsctl.fleet.rollout import LineReporter
from opsctl.health.checks import check_hosts
from opsctl.health.levels import HostHealth, Level
from opsctl.health.probe import ssh_probe
from opsctl.host import releaseroot
from opsctl.inventory import HostConfig
from opsctl.lock import hostlock
from opsctl.release import make_manifest
from opsctl.ssh import connect
from tests.fault.conftest import FIGURES
from tests.fault.harness import (
    FAILS_UNDER_THE_UNIT,
    FORGES_UNDER_THE_UNIT,
    LEDGER,
    ONE_EARLY_NAN_UNDER_THE_UNIT,
    SLOW_START_UNDER_THE_UNIT,
    assert_one_release,
    assert_rolled_back,
    cut_ssh_sessions,
    drive_traffic,
    fault_variant,
    read_end,
    running_release,
    standin_variant,
    variant,
)

pytestmark = pytest.mark.timeout(900)


def by_name(hosts: list[HostConfig]) -> dict[str, HostConfig]:
    return {h.name: h for h in hosts}


def short_gate(host: HostConfig, deadline_s: float = 20.0, **service: Any) -> HostConfig:
    gate = host.gate.model_copy(update={"deadline_s": deadline_s, "poll_interval_s": 0.5})
    return host.model_copy(update={"gate": gate, "service": host.service.model_copy(update=service)})


class Lines(LineReporter):
    def __init__(self, host: str) -> None:
        self.log: list[str] = []
        super().__init__(host, self.log.append)

    def info(self, message: str) -> None:
        super().info(message)
        self.log.append(message)


def history_since(host: HostConfig, before: int) -> list[pipeline.HistoryRecord]:
    return list(read_end(host).history[before:])


# ---------------------------------------------------------------------------------------------- forgery


def test_forged_and_wrong_token_lines_never_pass_a_deploy(hosts: list[HostConfig], tmp_path: Path) -> None:
    h = short_gate(by_name(hosts)["tb1"])
    before = read_end(h)
    tree = standin_variant(tmp_path / "forger", f"forger-{time.time_ns()}", FORGES_UNDER_THE_UNIT)
    new = make_manifest(tree).id
    rep = Lines(h.name)
    res = pipeline.deploy(h, tree, pipeline.DeployOptions(), rep)
    LEDGER.fault(
        "tb1's unit prints only forged lines: [kdtree] inside a logged request, and real lines with a wrong token"
    )
    assert res.verdict == "NODATA", res.line()
    assert "ignored" in res.reason and res.rolled_back_to == before.current
    assert any("inside another message" in m for m in rep.log), rep.log[-5:]
    assert any("wrong token" in m for m in rep.log), rep.log[-5:]
    after = read_end(h)
    assert_rolled_back(before, after, new)
    assert running_release(h) == before.current


def test_a_silent_tp_rank_is_nodata_and_rolls_back(hosts: list[HostConfig], tmp_path: Path) -> None:
    """The server answers the probe, but its TP rank 1 of 2 prints no parity line (standin.fault silent-rank:1).
    The gate's deadline (20 s) comes before the probe's grace for parity lines (30 s): NODATA naming the rank."""
    h = short_gate(by_name(hosts)["tb2"])
    before = read_end(h)
    tree = fault_variant(tmp_path / "silent", f"silent-{time.time_ns()}", "silent-rank:1")
    new = make_manifest(tree).id
    res = pipeline.deploy(h, tree, pipeline.DeployOptions())
    LEDGER.fault("tb2's unit serves, but prints parity for TP rank 0 of 2 only")
    assert res.verdict == "NODATA" and "TP rank(s) 1 of 2" in res.reason, res.line()
    assert res.rolled_back_to == before.current and res.rollback_verdict == "PASS", res.line()
    assert_rolled_back(before, read_end(h), new)
    assert running_release(h) == before.current


def test_first_failing_line_to_the_rollbacks_restart(hosts: list[HostConfig], tmp_path: Path) -> None:
    h = short_gate(by_name(hosts)["tb3"])
    before = read_end(h)
    tree = fault_variant(tmp_path / "bad", f"bad-{time.time_ns()}", FAILS_UNDER_THE_UNIT)
    new = make_manifest(tree).id
    res = pipeline.deploy(h, tree, pipeline.DeployOptions())
    LEDGER.fault("tb3 gets a release whose parity fails only under the unit (passes the pre-restart check)")
    assert res.verdict == "FAIL" and res.rolled_back_to == before.current and res.rollback_verdict == "PASS", res.line()
    after = read_end(h)
    assert_rolled_back(before, after, new)
    # From the journal: the failed invocation's first failing line, and the rollback invocation's start.
    with connect(h) as r:
        lines = r.run(
            f"journalctl -u {h.unit}.service -o json --output-fields=MESSAGE,_SYSTEMD_INVOCATION_ID --no-pager -q "
            "--since -600s",
            timeout=60,
        ).stdout.splitlines()
    entries = [json.loads(x) for x in lines if x.startswith("{")]
    failing = [
        e
        for e in entries
        if isinstance(e.get("MESSAGE"), str)
        and e["MESSAGE"].startswith("[kdtree] L")
        and float(e["MESSAGE"].split("rel=")[1].split()[0]) >= h.gate.fail_rel
    ]
    assert failing, "no failing parity line in the journal"
    bad_invocation = failing[0]["_SYSTEMD_INVOCATION_ID"]
    first_fail = int(failing[0]["__REALTIME_TIMESTAMP"]) / 1e6
    later = [
        e
        for e in entries
        if e.get("_SYSTEMD_INVOCATION_ID") not in (None, bad_invocation)
        and int(e["__REALTIME_TIMESTAMP"]) / 1e6 > first_fail
    ]
    assert later, "no invocation after the failed one"
    restart_at = int(later[0]["__REALTIME_TIMESTAMP"]) / 1e6
    seconds = restart_at - first_fail
    FIGURES["first failing parity line -> rollback's restart (s)"] = seconds
    # The time is a figure (poll interval, SSH round trips, the machine's load), not a pass mark; the bound proves
    # the rollback followed the failing line instead of waiting for the gate's deadline.
    assert 0 < seconds < h.gate.deadline_s / 2, seconds


# ---------------------------------------------------------------------------------------------- cuts


def test_ssh_cut_during_the_restart_restores_the_old_release(hosts: list[HostConfig], tmp_path: Path) -> None:
    h = short_gate(by_name(hosts)["tb1"])
    before = read_end(h)
    tree = variant(tmp_path / "slow-restart", f"slow-restart-{time.time_ns()}")
    unit = tree / "systemd" / "sglang-k26-ddtree.service"
    unit.write_text(unit.read_text().replace("ExecStart=", "ExecStartPre=/bin/sleep 4\nExecStart=", 1))
    new = make_manifest(tree).id
    cut: list[str] = []

    class CutDuringRestart(Lines):
        def step(self, name: str, detail: str = "") -> None:
            super().step(name, detail)
            if name == "restart" and not cut:
                threading.Timer(1.5, lambda: cut.extend(cut_ssh_sessions(h))).start()

    res = pipeline.deploy(h, tree, pipeline.DeployOptions(), CutDuringRestart(h.name))
    assert cut, "no SSH session was cut"
    LEDGER.fault(f"tb1's SSH sessions killed 1.5 s into `systemctl restart` ({len(cut)} sshd processes)")
    assert res.verdict == "ERROR" and res.rolled_back_to == before.current and res.rollback_verdict == "PASS", (
        res.line()
    )
    after = read_end(h)
    assert_one_release(after, before.current)
    assert running_release(h) == before.current  # not the new one, left running behind current's back
    assert new in after.bad
    records = after.records_since(before)
    assert any(r.release == new and r.verdict == "ERROR" for r in records), records
    assert any(r.event == "rollback" and r.verdict == "PASS" for r in records), records


def _opsctl_deploy(h: HostConfig, tree: Path, tmp_path: Path, gate_deadline: int) -> subprocess.Popen[str]:
    inv = Path(os.path.expanduser(h.known_hosts)).parent / "inventory.yaml"
    text = inv.read_text().replace("    deadline_s: 60\n", f"    deadline_s: {gate_deadline}\n")
    mine = tmp_path / "inventory.yaml"
    mine.write_text(text)
    return subprocess.Popen(
        [sys.executable, "-m", "opsctl", "deploy", h.name, "--yes", "--src", str(tree), "-i", str(mine)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _wait_for(proc: subprocess.Popen[str], needle: str, seen: list[str], timeout: float = 120) -> None:
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    for line in proc.stdout:
        seen.append(line)
        if needle in line:
            return
        assert time.monotonic() < deadline, "".join(seen[-20:])
    raise AssertionError(f"{needle!r} never printed:\n{''.join(seen[-20:])}")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_a_signal_during_the_gate_restores_the_old_release(
    hosts: list[HostConfig], tmp_path: Path, sig: signal.Signals
) -> None:
    h = by_name(hosts)["tb2"]
    before = read_end(h)
    tree = standin_variant(tmp_path / "slow", f"slow-{sig.name}-{time.time_ns()}", SLOW_START_UNDER_THE_UNIT)
    new = make_manifest(tree).id
    proc = _opsctl_deploy(h, tree, tmp_path, gate_deadline=300)
    seen: list[str] = []
    try:
        _wait_for(proc, "✓ restart", seen)  # the restart's step line: the gate runs now
        time.sleep(3)  # inside the gate: the new release is silent (loading)
        proc.send_signal(sig)
        _wait_for(proc, "restoring a consistent state", seen, timeout=30)
        proc.send_signal(sig)  # a second signal during the restore must not abandon it
        assert proc.stdout is not None
        seen.extend(proc.stdout)
        rc = proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    out = "".join(seen)
    LEDGER.fault(f"{sig.name} to opsctl deploy during tb2's gate, and again during the restore")
    assert rc == 130, out[-2000:]
    assert "still restoring the host" in out, out[-2000:]
    after = read_end(h)
    assert_one_release(after, before.current)
    assert running_release(h) == before.current
    records = after.records_since(before)
    assert any(r.release == new and r.verdict == "INTERRUPTED" for r in records), records
    rollback = [r for r in records if r.event == "rollback"]
    assert rollback and rollback[-1].verdict == "PASS", records


def test_a_lost_reply_to_the_lock_does_not_leak_it(hosts: list[HostConfig], tmp_path: Path) -> None:
    """The remote mkdir of the lock ran, its reply never came back. The retry finds its own lock and the deploy
    goes on; with no retry left the deploy fails, and the lock is still released."""
    h = short_gate(by_name(hosts)["tb3"])

    def losing(times: int) -> pipeline.Connect:
        lost = [0]

        class LosingRemote:
            def __init__(self, real: Any) -> None:
                self._real = real

            def __getattr__(self, name: str) -> Any:
                return getattr(self._real, name)

            def run(self, cmd: Any, **kw: Any) -> Any:
                res = self._real.run(cmd, **kw)
                if isinstance(cmd, str) and "ACQUIRED" in cmd and lost[0] < times:
                    lost[0] += 1
                    raise HostUnreachable(h.name, "connection lost before the reply (injected after the command ran)")
                return res

        def connect_losing(host: HostConfig) -> Any:
            from contextlib import contextmanager

            @contextmanager
            def cm() -> Any:
                with connect(host) as r:
                    yield LosingRemote(r)

            return cm()

        return connect_losing

    before = read_end(h)
    tree = variant(tmp_path / "lost-1", f"lost-1-{time.time_ns()}")
    res = pipeline.deploy(h, tree, pipeline.DeployOptions(), connect=losing(1))
    LEDGER.fault("tb3: the reply to the lock's mkdir lost once")
    assert res.verdict == "PASS", res.line()
    assert_one_release(read_end(h), make_manifest(tree).id)

    no_retry = h.model_copy(update={"gate": h.gate.model_copy(update={"ssh_retries": 0})})
    before = read_end(h)
    tree2 = variant(tmp_path / "lost-2", f"lost-2-{time.time_ns()}")
    with pytest.raises(HostUnreachable):
        pipeline.deploy(no_retry, tree2, pipeline.DeployOptions(), connect=losing(1))
    LEDGER.fault("tb3: the reply to the lock's mkdir lost with no retry allowed")
    after = read_end(h)
    assert_one_release(after, before.current)
    assert after.history == before.history


def test_an_expired_lease_is_taken_over_with_a_warning(hosts: list[HostConfig], tmp_path: Path) -> None:
    h = short_gate(by_name(hosts)["tb1"])
    layout = releaseroot.Layout(h.root)
    gone = hostlock.LockOwner.mine("deploy r00000000dead")
    with connect(h) as r:
        hostlock.acquire_lock(r, layout, gone, h.name, lease_s=1)
    time.sleep(2.5)
    LEDGER.fault("tb1: a lock whose holder stopped renewing its lease")
    rep = Lines(h.name)
    tree = variant(tmp_path / "lease", f"lease-{time.time_ns()}")
    res = pipeline.deploy(h, tree, pipeline.DeployOptions(), rep)
    assert res.verdict == "PASS", res.line()
    warning = [m for m in rep.log if "took over the deploy lock" in m]
    assert warning and "deploy r00000000dead" in warning[0] and "lease ran out" in warning[0], rep.log
    assert_one_release(read_end(h), make_manifest(tree).id)


# ---------------------------------------------------------------------------------------------- health


def _health(h: HostConfig) -> HostHealth:
    return check_hosts([h], ssh_probe).results[0]


def test_health_never_rolls_back_a_stopped_unit_or_an_old_nan(hosts: list[HostConfig], tmp_path: Path) -> None:
    h = by_name(hosts)["tb2"]
    # 1. An operator stops the unit: WARN, no rollback wanted.
    with connect(h) as r:
        r.run(f"systemctl stop {h.unit}.service", timeout=120)
    try:
        stopped = _health(h)
        LEDGER.fault("tb2's unit stopped by an operator")
        assert stopped.check("unit").level is Level.WARN and not stopped.wants_rollback  # type: ignore[union-attr]
    finally:
        with connect(h) as r:
            r.run(f"systemctl start {h.unit}.service", timeout=120)
    # 2. The running invocation printed one NaN line long ago, and passing lines since.
    tree = standin_variant(tmp_path / "nan", f"nan-{time.time_ns()}", ONE_EARLY_NAN_UNDER_THE_UNIT)
    staged = pipeline.deploy(h, tree, pipeline.DeployOptions(no_restart=True))
    assert staged.verdict == "STAGED", staged.line()
    with connect(h) as r:
        r.run(f"systemctl restart {h.unit}.service", timeout=120)
    # Traffic: the burst samples every one of its first 8 verify steps (3 layers: 24 lines a rank, the NaN first,
    # then passes); speculative decoding accepts several tokens a step, so 32 tokens are about 10 steps.
    drive_traffic(h, requests=1, max_new_tokens=32)
    time.sleep(0.5)  # journald has the lines
    old_nan = _health(h)
    LEDGER.fault("tb2's running invocation printed a NaN line, then passing lines")
    parity = old_nan.check("parity")
    assert parity is not None and parity.level is Level.WARN and "earlier line failed" in parity.detail, parity
    assert not old_nan.wants_rollback
    LEDGER.verified("health: WARN, no rollback, for a stopped unit and for an old NaN line")


def test_health_rolls_back_on_real_evidence(hosts: list[HostConfig], tmp_path: Path) -> None:
    h = short_gate(by_name(hosts)["tb3"])
    before = read_end(h)
    tree = fault_variant(tmp_path / "bad-live", f"bad-live-{time.time_ns()}", FAILS_UNDER_THE_UNIT)
    staged = pipeline.deploy(h, tree, pipeline.DeployOptions(no_restart=True))
    assert staged.verdict == "STAGED", staged.line()
    with connect(h) as r:  # restarted by hand, as after a host reboot: the bad kernel now serves
        r.run(f"systemctl restart {h.unit}.service", timeout=120)
    drive_traffic(h, requests=1, max_new_tokens=2)  # a user's request: the bad kernel verifies it
    time.sleep(0.5)
    result = _health(h)
    LEDGER.fault("tb3 runs a release whose parity fails, started outside opsctl")
    assert result.check("parity").level is Level.CRIT and result.wants_rollback  # type: ignore[union-attr]
    res = pipeline.rollback(h)
    assert res.verdict == "PASS", res.line()
    assert_one_release(read_end(h), before.current)
