"""systemctl commands on the service unit, as text."""

from __future__ import annotations

import shlex
from pathlib import Path

from opsctl.unit import systemctl as hu
from tests.shell import sh


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
        "systemctl show -p EnvironmentFiles --value",
    ):
        assert key in cmd


def test_restart_output_lists_every_environment_file(tmp_path: Path) -> None:
    """systemctl prints one EnvironmentFiles line per file: the token file second (after the inventory's
    environment_file, as the rendered unit lists them) was lost when the value was read as one line."""
    fake = tmp_path / "systemctl"
    fake.write_text(
        "#!/bin/sh\n"
        'case "$*" in\n'
        "  *NRestarts*) echo 4 ;;\n"
        "  *EnvironmentFiles*) echo '/etc/kd/sglang.env (ignore_errors=yes)'; "
        "echo '/srv/kd%n/state/parity.env (ignore_errors=yes)' ;;\n"
        "esac\n"
    )
    fake.chmod(0o755)
    out = sh(hu.restart_command("u"), env={"PATH": f"{tmp_path}:/usr/bin:/bin"}).stdout
    facts = hu.parse_restart_output(out)
    assert facts == hu.RestartFacts(rc=0, restarts=4, envfiles=("/etc/kd/sglang.env", "/srv/kd%n/state/parity.env"))
    assert hu.parse_restart_output("rc=1\nrestarts=\n") == hu.RestartFacts(1, None, ())


def test_enable_once_and_read_unit_file() -> None:
    assert hu.enable_once_command("u") == "systemctl is-enabled --quiet u.service || systemctl enable --quiet u.service"
    assert hu.read_unit_file_command("a b") == f"cat {shlex.quote('/etc/systemd/system/a b.service')} 2>/dev/null"
    assert sh(hu.read_unit_file_command("opsctl-test-no-such-unit")).returncode != 0
