"""Timer/service rendering, `systemd-analyze verify` on the result, install/remove into a scratch unit dir."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from opsctl.errors import UsageError
from opsctl.health import schedule
from tests.builders import inventory

needs_analyze = pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")


def spec(tmp_path: Path, **health: object) -> schedule.ScheduleSpec:
    inv = inventory(
        {"tb1": {}, "tb2": {}}, defaults={"health": {"on_calendar": "*:0/5", "randomized_delay_s": 30, **health}}
    )
    (tmp_path / "inventory.yaml").write_text("x")
    return schedule.make_spec(
        list(inv.hosts.values()),
        target="fleet",
        inventory=tmp_path / "inventory.yaml",
        opsctl="/usr/bin/true",
        prometheus=tmp_path / "textfile" / "opsctl.prom",
        state=tmp_path / "state",
    )


def test_render_fills_every_placeholder(tmp_path: Path) -> None:
    units = schedule.render(spec(tmp_path))
    timer, service = units[schedule.TIMER], units[schedule.SERVICE]
    assert "OnCalendar=*:0/5" in timer and "Persistent=true" in timer and "RandomizedDelaySec=30" in timer
    assert f"ExecStart=/usr/bin/true health fleet --prometheus {tmp_path}/textfile/opsctl.prom" in service
    assert f'Environment="OPSCTL_INVENTORY={tmp_path}/inventory.yaml"' in service
    assert "SuccessExitStatus=1 2" in service
    for text in units.values():
        body = [line for line in text.splitlines() if not line.startswith("#")]
        assert not any("@" in line for line in body)


def test_hosts_must_agree_on_the_schedule(tmp_path: Path) -> None:
    inv = inventory({"tb1": {"health": {"on_calendar": "hourly"}}, "tb2": {}})
    with pytest.raises(UsageError, match="disagree"):
        schedule.make_spec(list(inv.hosts.values()), target="fleet", inventory=tmp_path / "i.yaml", opsctl="/bin/true")


def test_values_systemd_would_interpret_are_refused(tmp_path: Path) -> None:
    s = spec(tmp_path)
    with pytest.raises(UsageError):
        schedule.render(schedule.ScheduleSpec(**{**s.__dict__, "target": "fleet%n"}))
    with pytest.raises(UsageError):
        schedule.render(schedule.ScheduleSpec(**{**s.__dict__, "prometheus": Path('/tmp/a"b')}))


@needs_analyze
def test_rendered_units_pass_systemd_analyze_verify(tmp_path: Path) -> None:
    units = schedule.render(spec(tmp_path))
    unit_dir = tmp_path / "units"
    unit_dir.mkdir()
    for name, text in units.items():
        (unit_dir / name).write_text(text)
    r = subprocess.run(
        ["systemd-analyze", "verify", *(str(unit_dir / n) for n in units)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    problems = [line for line in (r.stdout + r.stderr).splitlines() if "opsctl-health" in line]
    assert r.returncode == 0 and not problems, r.stdout + r.stderr


@needs_analyze
def test_bad_calendar_is_refused_before_writing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(schedule.UNIT_DIR_ENV, str(tmp_path / "units"))
    with pytest.raises(UsageError, match="calendar"):
        schedule.install(spec(tmp_path, on_calendar="every tuesday-ish"), user=False, activate=False)
    assert not (tmp_path / "units").exists()


def test_install_status_remove_in_a_scratch_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(schedule.UNIT_DIR_ENV, str(tmp_path / "units"))
    calls: list[list[str]] = []

    def runner(argv: list[str]) -> subprocess.CompletedProcess[str]:
        calls.append(argv)
        out = "ActiveState=active\nNextElapseUSecRealtime=Sun 2026-11-29 09:00:00 UTC\n" if "show" in argv else ""
        return subprocess.CompletedProcess(argv, 0, out, "")

    s = spec(tmp_path)
    first = schedule.install(s, user=False, runner=runner, activate=True)
    assert first.changed and first.activated
    assert ["systemctl", "enable", "--now", schedule.TIMER] in calls
    again = schedule.install(s, user=False, runner=runner, activate=True)
    assert not again.changed  # idempotent: same text, no rewrite
    st = schedule.status(user=False, runner=runner, activate=True)
    assert st.installed and st.timer["ActiveState"] == "active" and "health fleet" in (st.exec_start or "")
    gone = schedule.remove(user=False, runner=runner, activate=True)
    assert gone.changed and not (tmp_path / "units" / schedule.TIMER).exists()
    assert ["systemctl", "disable", "--now", schedule.TIMER] in calls
    assert not schedule.status(user=False, runner=runner, activate=False).installed
    # not root: the user's systemd instance
    user_calls: list[list[str]] = []
    schedule.install(
        s, user=True, runner=lambda a: user_calls.append(a) or subprocess.CompletedProcess(a, 0, "", ""), activate=True
    )
    assert user_calls and all(c[:2] == ["systemctl", "--user"] for c in user_calls if c[0] == "systemctl")


def test_the_service_can_finish_every_rollback_it_starts(tmp_path: Path) -> None:
    """TimeoutStartSec was 75 s while a rollback (restart + gate) takes minutes: systemd would kill it mid-way."""
    inv = inventory(
        {"tb1": {}, "tb2": {}},
        defaults={"gate": {"deadline_s": 1800}, "service": {"start_timeout_s": 1200}},
    )
    hosts = list(inv.hosts.values())
    kw = {"target": "fleet", "inventory": tmp_path / "i.yaml", "opsctl": "/bin/true", "state": tmp_path / "s"}
    plain = schedule.make_spec(hosts, **kw)  # type: ignore[arg-type]
    rolling = schedule.make_spec(hosts, rollback_on_fail=True, **kw)  # type: ignore[arg-type]
    assert plain.timeout_s < 120
    # Two hosts, each a restart (1200 s + 60) and a gate (1800 s) at most, one after another.
    assert rolling.timeout_s >= plain.timeout_s + 2 * (1200 + 60 + 1800)
    service = schedule.render(rolling)[schedule.SERVICE]
    assert f"TimeoutStartSec={rolling.timeout_s}" in service and "--rollback-on-fail" in service
