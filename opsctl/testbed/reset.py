"""Putting a testbed host back to a clean state between tests: faults undone, then over SSH the unit and the
release root removed."""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import OpsError, TestbedError
from ..inventory import HostConfig
from .lifecycle import Testbed
from .ports import sshd_answers


def reset_host(host: HostConfig, testbed: Testbed | None = None) -> None:
    """Bring a testbed host back to a clean state for the next test.

    Boots it if it was powered off, restores its disk and sshd, then over SSH: stops and removes the unit (and
    its drop-ins), removes the release root, reloads systemd and resets failed units.
    """
    from ..ssh import connect

    tb = testbed or testbed_of(host)
    if host.name in tb.provisioned():
        tb.free_disk(host.name)
        if not tb.running(host.name):
            tb.boot(host.name)
        elif not sshd_answers(tb.state(host.name).port):
            tb.start_sshd(host.name)
    unit = f"{host.unit}.service"
    script = " ; ".join(
        [
            f"systemctl stop {unit} 2>/dev/null",
            f"systemctl disable {unit} 2>/dev/null",
            f"rm -rf /etc/systemd/system/{unit} /etc/systemd/system/{unit}.d /run/systemd/system/{unit} "
            f"/run/systemd/system/{unit}.d /etc/systemd/system/multi-user.target.wants/{unit}",
            "systemctl daemon-reload",
            "systemctl reset-failed",
            f"rm -rf {host.root}",
            "true",
        ]
    )
    try:
        with connect(host) as r:
            r.run(script, timeout=60)
    except OpsError as e:
        raise TestbedError(f"reset of {host.name} failed: {e}") from e


def testbed_of(host: HostConfig) -> Testbed:
    """The testbed a host of a testbed inventory belongs to: its known_hosts file lies in the state directory."""
    state_dir = Path(os.path.expanduser(host.known_hosts)).parent
    return Testbed(state_dir) if (state_dir / "hosts").is_dir() else Testbed()
