"""`opsctl schedule install|status|remove` against a real systemd: a testbed host's systemd (PID 1) loads,
enables and schedules the rendered timer, runs the check service once, and forgets both after remove.

The controller's systemd is the host's here: the unit files go into the host's /etc/systemd/system (its
overlay rootfs, seen from this machine) and systemctl runs on the host over the SSH layer. The service's
program is /usr/bin/true, which exists there; everything else is opsctl's own rendering and install logic."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from opsctl.health import schedule
from opsctl.inventory import Inventory
from opsctl.ssh import SshSession, connect
from opsctl.testbed import Testbed


def _runner(r: SshSession) -> schedule.Runner:
    def run(argv: list[str]) -> subprocess.CompletedProcess[str]:
        res = r.run(argv, check=False, timeout=60)
        return subprocess.CompletedProcess(argv, res.rc, res.stdout, res.stderr)

    return run


def test_install_status_run_remove_on_real_systemd(testbed: Inventory, monkeypatch: pytest.MonkeyPatch) -> None:
    host = testbed.host("tb2")
    monkeypatch.setenv(schedule.UNIT_DIR_ENV, str(Testbed().rootfs(host.name) / "etc/systemd/system"))
    # Paths that exist on the host, so the service's WorkingDirectory and environment resolve there too.
    spec = schedule.make_spec(
        [host], target="tb2", inventory=Path("/etc/hostname"), opsctl="/usr/bin/true", state=Path("/tmp")
    )
    with connect(host) as r:
        run = _runner(r)
        try:
            installed = schedule.install(spec, user=False, runner=run, activate=True)
            assert installed.activated
            st = schedule.status(user=False, runner=run, activate=True)
            assert st.installed
            assert st.timer["ActiveState"] == "active" and st.timer["UnitFileState"] == "enabled", st.timer
            assert st.timer["NextElapseUSecRealtime"], st.timer  # systemd computed the next run from OnCalendar
            assert r.run(["systemctl", "is-enabled", schedule.TIMER], check=False).stdout.strip() == "enabled"
            # What the timer would start: the oneshot check service runs to completion.
            r.run(["systemctl", "start", schedule.SERVICE], timeout=60)
            shown = r.run(["systemctl", "show", schedule.SERVICE, "-p", "Result", "--value"]).stdout.strip()
            assert shown == "success"
            again = schedule.install(spec, user=False, runner=run, activate=True)
            assert not again.changed  # same text: nothing rewritten
        finally:
            gone = schedule.remove(user=False, runner=run, activate=True)
        assert gone.changed
        assert r.run(["systemctl", "is-enabled", schedule.TIMER], check=False).rc != 0
        assert not schedule.status(user=False, runner=run, activate=True).installed


@pytest.mark.parametrize(("code", "result"), [(2, "success"), (3, "exit-code")])
def test_the_timer_counts_findings_as_success_and_a_failed_check_as_failure(
    testbed: Inventory, monkeypatch: pytest.MonkeyPatch, code: int, result: str
) -> None:
    """The installed service run by real systemd: WARN (1) and CRIT (2) are runs that worked; 3, the health
    check's own failure (a broken inventory used to exit 2 and read as CRIT), fails the unit."""
    host = testbed.host("tb2")
    monkeypatch.setenv(schedule.UNIT_DIR_ENV, str(Testbed().rootfs(host.name) / "etc/systemd/system"))
    program = f"/usr/local/bin/opsctl-exit-{code}"
    spec = schedule.make_spec([host], target="tb2", inventory=Path("/etc/hostname"), opsctl=program, state=Path("/tmp"))
    with connect(host) as r:
        run = _runner(r)
        r.write_file(program, f"#!/bin/sh\nexit {code}\n", mode=0o755)
        try:
            schedule.install(spec, user=False, runner=run, activate=True)
            r.run(["systemctl", "start", schedule.SERVICE], timeout=60, check=False)
            shown = r.run(["systemctl", "show", schedule.SERVICE, "-p", "Result", "--value"]).stdout.strip()
            assert shown == result, (code, shown)
        finally:
            schedule.remove(user=False, runner=run, activate=True)
            r.run(["systemctl", "reset-failed", schedule.SERVICE], check=False)
            r.run(["rm", "-f", program])
