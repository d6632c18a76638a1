"""The CLI without hosts: hosts table/JSON, the error boundary, command-module registration."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).parents[2]


def _opsctl(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "opsctl", *args],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
        cwd=REPO,
        env={**os.environ, **(env or {})},
    )


def test_hosts_json_lists_hosts_and_groups(tmp_path: Path) -> None:
    inv = tmp_path / "inv.yaml"
    inv.write_text("hosts:\n  a: {address: 10.0.0.1}\n  b: {address: 10.0.0.2, port: 2200}\ngroups:\n  g: [b]\n")
    proc = _opsctl("hosts", "--json", env={"OPSCTL_INVENTORY": str(inv)})
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert [h["name"] for h in doc["hosts"]] == ["a", "b"]
    assert doc["hosts"][1]["port"] == 2200 and doc["hosts"][1]["groups"] == ["g"] and doc["groups"] == {"g": ["b"]}


def test_hosts_table_of_the_repository_inventory() -> None:
    proc = _opsctl("--inventory", "inventory.yaml", "hosts")
    assert proc.returncode == 0, proc.stderr
    assert "ct200" in proc.stdout and "10.1.230.171" in proc.stdout and "prod" in proc.stdout


def test_inventory_error_is_one_red_line_and_exit_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("hosts:\n  a:\n    address: h\n    unit: 'x; reboot'\n")
    proc = _opsctl("-i", str(bad), "hosts")
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and f"{bad}:4: hosts.a.unit" in lines[0]


def test_unknown_target_exit_code() -> None:
    proc = _opsctl("-i", "inventory.yaml", "ping", "no-such-host")
    assert proc.returncode == 2 and "no host or group named 'no-such-host'" in proc.stderr
