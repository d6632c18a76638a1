"""opsctl/testbed/prereqs.py: what stops the testbed from running here, said as what to do."""

from __future__ import annotations

from opsctl.testbed.prereqs import missing_tools, prerequisite_problem


def test_prerequisites_name_what_to_install() -> None:
    assert prerequisite_problem(0, {}) is None
    msg = prerequisite_problem(1000, {})
    assert msg is not None and "root" in msg
    missing = missing_tools(lambda tool: None if tool in ("systemd-nspawn", "debootstrap") else "/usr/bin/x")
    assert missing == {"systemd-nspawn": "systemd-container", "debootstrap": "debootstrap"}
    msg = prerequisite_problem(0, missing)
    assert msg is not None and "apt-get install -y debootstrap systemd-container" in msg
