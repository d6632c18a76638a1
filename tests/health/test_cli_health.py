"""The health and schedule commands through Typer, against an inventory whose host refuses connections."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from opsctl.cli import health as cli_health
from opsctl.health import schedule


def app() -> typer.Typer:
    """A bare app with only these commands (opsctl.cli.main adds them the same way)."""
    root = typer.Typer()

    @root.callback()
    def main() -> None:
        """opsctl stand-in."""

    root.add_typer(cli_health.app)
    root.add_typer(cli_health.schedule_app, name="schedule")
    return root


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def inv_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("OPSCTL_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv(schedule.UNIT_DIR_ENV, str(tmp_path / "units"))
    # never enable a timer in the systemd of the machine running the tests
    monkeypatch.setattr(schedule, "systemd_running", lambda: False)
    path = tmp_path / "inventory.yaml"
    path.write_text(
        "defaults:\n  address: 127.0.0.1\n  connect_timeout_s: 3\n  gpu_arch: null\n"
        f"  port: {closed_port()}\n  known_hosts: {tmp_path}/known_hosts\n"
        "  health: {on_calendar: '*:0/10', randomized_delay_s: 5}\n"
        "hosts:\n  down1: {}\n  down2: {}\ngroups:\n  pair: [down1, down2]\n"
    )
    return path


def test_unreachable_group_is_crit_exit_2_with_json_history_and_textfile(inv_file: Path, tmp_path: Path) -> None:
    prom = tmp_path / "prom" / "opsctl.prom"
    r = CliRunner().invoke(app(), ["health", "pair", "--json", "--prometheus", str(prom), "--inventory", str(inv_file)])
    assert r.exit_code == 2, r.output
    doc = json.loads(r.stdout)
    assert doc["status"] == "crit" and [h["host"] for h in doc["hosts"]] == ["down1", "down2"]
    assert all(h["checks"]["ssh"]["status"] == "crit" for h in doc["hosts"])
    assert 'opsctl_health_status{host="down1"} 2' in prom.read_text()
    history = (tmp_path / "state" / "health-history.jsonl").read_text().splitlines()
    assert len(history) == 2
    assert json.loads((tmp_path / "state" / "alert-state.json").read_text()) == {"down1": "crit", "down2": "crit"}


def test_table_output_and_usage_errors(inv_file: Path) -> None:
    r = CliRunner().invoke(app(), ["health", "--all", "-i", str(inv_file)])
    assert r.exit_code == 2 and "CRIT" in r.stdout and "health all: CRIT" in r.stdout
    # Usage errors are one red line and exit 3, the health check's own failure code (no exception escapes the
    # command; 2 would read as CRIT, a finding, to the timer).
    both = CliRunner().invoke(app(), ["health", "pair", "--all", "-i", str(inv_file)])
    assert both.exit_code == 3 and "give a HOST or GROUP, or --all, not both" in both.output
    neither = CliRunner().invoke(app(), ["health", "-i", str(inv_file)])  # several hosts, no `default:`
    assert neither.exit_code == 3 and "which host?" in neither.output and "add `default: HOST`" in neither.output


def test_schedule_install_status_remove(inv_file: Path, tmp_path: Path) -> None:
    runner = CliRunner()
    r = runner.invoke(app(), ["schedule", "install", "pair", "--system", "--inventory", str(inv_file)])
    assert r.exit_code == 0, r.output
    timer = (tmp_path / "units" / schedule.TIMER).read_text()
    assert "OnCalendar=*:0/10" in timer and "RandomizedDelaySec=5" in timer
    st = runner.invoke(app(), ["schedule", "status", "--system", "--json"])
    assert st.exit_code == 0 and json.loads(st.stdout)["installed"] is True
    rm = runner.invoke(app(), ["schedule", "remove", "--system"])
    assert rm.exit_code == 0 and not (tmp_path / "units" / schedule.TIMER).exists()


def test_a_failed_alert_state_still_rolls_back_and_fails_the_run_with_its_own_code(
    inv_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The alert state cannot be read or written (a directory where the file should be): the hosts' verdicts are
    still printed, --rollback-on-fail still runs, and the run exits 3, which the timer does not count as success."""
    (tmp_path / "state" / "alert-state.json").mkdir(parents=True)
    rolled: list[list[str]] = []

    def rollback(hosts, run, quiet):  # type: ignore[no-untyped-def]
        rolled.append([h.name for h in hosts])
        return []

    monkeypatch.setattr(cli_health, "_rollback", rollback)
    r = CliRunner().invoke(app(), ["health", "pair", "--json", "--rollback-on-fail", "-i", str(inv_file)])
    assert r.exit_code == cli_health.EXIT_HEALTH_ERROR == 3, r.output
    doc = json.loads(r.stdout)
    assert doc["status"] == "crit" and doc["exit_code"] == 3 and "alert hook failed" in doc["error"]
    assert rolled == [["down1", "down2"]]
    text = CliRunner().invoke(app(), ["health", "pair", "-i", str(inv_file)])
    assert text.exit_code == 3 and "health pair: CRIT" in text.stdout and "alert hook failed" in text.output


def test_a_crash_of_the_health_command_exits_3_as_json(inv_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(*_a: object, **_k: object) -> None:
        raise RuntimeError("bug")

    monkeypatch.setattr(cli_health, "check_hosts", boom)
    r = CliRunner().invoke(app(), ["health", "pair", "--json", "-i", str(inv_file)])
    assert r.exit_code == 3
    assert json.loads(r.stdout) == {"error": "RuntimeError: bug", "exit_code": 3, "kind": "HealthCheckFailed"}


def test_health_failures_through_main_exit_3_usage_errors_included(
    inv_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from opsctl.cli.main import main

    assert main(["health", "--json", "-i", str(inv_file.parent / "missing.yaml")]) == 3
    assert json.loads(capsys.readouterr().out)["kind"] == "InventoryError"
    assert main(["health", "--json", "--no-such-option"]) == 3  # an option parser error of health: its code too
    assert json.loads(capsys.readouterr().out) == {
        "error": "No such option: --no-such-option",
        "exit_code": 3,
        "kind": "NoSuchOption",
    }
