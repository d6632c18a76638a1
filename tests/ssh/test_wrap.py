"""The SSH layer's wrappers, run in a local shell: the run marker reaches every descendant, the killer finds
them, the atomic write leaves the old file or the new one."""

from __future__ import annotations

import os
import subprocess
import time
import uuid
from pathlib import Path

from opsctl.ssh import wrap as hs
from tests.shell import sh


def test_wrap_marks_the_command_and_its_children() -> None:
    run_id = uuid.uuid4().hex
    out = sh(hs.wrap_command("sh -c 'echo $OPSCTL_RUN_ID'", run_id, sudo=False)).stdout.strip()
    assert out == run_id
    assert hs.wrap_command("true", run_id, sudo=True).startswith(f"sudo -n env {hs.RUN_MARKER}={run_id} sh -c ")


def test_killer_ends_a_daemonised_child() -> None:
    run_id = uuid.uuid4().hex
    proc = subprocess.Popen(["/bin/sh", "-c", hs.wrap_command("setsid sleep 300 & wait", run_id, sudo=False)])
    try:
        time.sleep(0.5)
        assert sh(hs.kill_marked_command(run_id)).returncode == 0
        proc.wait(timeout=10)
        leftover = sh(f"grep -lxzF {hs.RUN_MARKER}={run_id} /proc/[0-9]*/environ 2>/dev/null").stdout
        assert leftover == ""
    finally:
        proc.kill()


def test_atomic_write_and_cat(tmp_path: Path) -> None:
    path = tmp_path / "it's a file"
    assert sh(hs.atomic_write_command(str(path), 0o600), stdin="new\n").returncode == 0
    assert path.read_text() == "new\n" and os.stat(path).st_mode & 0o777 == 0o600
    assert not [p for p in os.listdir(tmp_path) if ".opsctl-" in p]
    assert sh(hs.cat_command(str(path))).stdout == "new\n"
