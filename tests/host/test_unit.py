"""systemctl commands on the service unit, as text."""

from __future__ import annotations

import shlex

from opsctl.host import unit as hu

from .shell import sh


def test_argv_builders() -> None:
    assert hu.systemctl_argv("daemon-reload") == ["systemctl", "daemon-reload"]
    assert hu.systemctl_argv("enable", "--now", "t.timer", user=True) == [
        "systemctl",
        "--user",
        "enable",
        "--now",
        "t.timer",
    ]
    assert hu.action_argv("stop", "sglang") == ["systemctl", "stop", "sglang.service"]
    assert hu.status_argv("sglang") == ["systemctl", "status", "--no-pager", "-n", "15", "sglang.service"]
    assert hu.unit_file_path("sglang") == "/etc/systemd/system/sglang.service"
    assert shlex.split(hu.verify_command("/x y/u.service")) == ["systemd-analyze", "verify", "/x y/u.service"]


def test_restart_resets_then_reports_three_facts() -> None:
    cmd = hu.restart_command("odd unit;x")
    u = shlex.quote("odd unit;x.service")
    assert cmd.index(f"systemctl reset-failed {u}") < cmd.index(f"systemctl restart {u}")
    for key in (
        "rc=$?",
        "restarts=$(systemctl show -p NRestarts --value",
        "envfiles=$(systemctl show -p EnvironmentFiles",
    ):
        assert key in cmd


def test_enable_once_and_read_unit_file() -> None:
    assert hu.enable_once_command("u") == "systemctl is-enabled --quiet u.service || systemctl enable --quiet u.service"
    assert hu.read_unit_file_command("a b") == f"cat {shlex.quote('/etc/systemd/system/a b.service')} 2>/dev/null"
    assert sh(hu.read_unit_file_command("opsctl-test-no-such-unit")).returncode != 0
