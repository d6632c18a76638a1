"""Issue 16 on a real testbed host, through the CLI as a user types it: what a deploy prints for a good release,
an up-to-date one, a dry run, a release caught by the pre-restart parity check, its refused redeploy, and a logs
search that matches nothing."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from opsctl.inventory import Inventory
from opsctl.release import make_manifest
from opsctl.testbed import reset_host
from tests.pipeline import trees

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(
    not (trees.SOURCE / "backend/kdtree_backend/marshal.py").exists(), reason="backend marshal.py not in the tree"
)


def opsctl(inv: Inventory, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "opsctl", "-i", str(inv.path), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
        cwd=REPO,
        env={**os.environ, "COLUMNS": "200"},
    )


def test_deploy_output_as_a_user_sees_it(testbed: Inventory, tmp_path: Path) -> None:
    host = testbed.host("tb2")
    reset_host(host)
    good = trees.copy_tree(tmp_path / "good", tag="first-hour")
    good_id = make_manifest(good).id

    first = opsctl(testbed, "deploy", "tb2", "--src", str(good), "--yes")
    assert first.returncode == 0, first.stdout + first.stderr
    assert "1. preflight" in first.stdout and "gate rules:" in first.stdout  # work to do: the plan, with the rules
    assert re.search(rf"parity {good_id} \(new, pre-restart\) L\d+ .* PASS", first.stdout), first.stdout
    assert re.search(rf"parity {good_id} \(new\) L\d+ .* PASS", first.stdout)
    assert f"tb2: deploy {good_id} -> PASS" in first.stdout

    again = opsctl(testbed, "deploy", "tb2", "--src", str(good), "--yes")
    assert again.returncode == 0 and f"tb2: deploy {good_id} -> UP-TO-DATE" in again.stdout
    assert "1. preflight" not in again.stdout  # nothing will run: no plan

    bad = trees.classic_bug(tmp_path / "bad", tag="first-hour-bug")
    bad_id = make_manifest(bad).id
    plan = opsctl(testbed, "deploy", "tb2", "--src", str(bad), "--dry-run")
    assert plan.returncode == 0 and "1. preflight" in plan.stdout
    assert "a line in between is INCONCLUSIVE" in " ".join(plan.stdout.split())

    caught = opsctl(testbed, "deploy", "tb2", "--src", str(bad), "--yes")
    out = caught.stdout
    assert caught.returncode == 31, out + caught.stderr
    assert re.search(rf"parity {bad_id} \(new, pre-restart\) L\d+( TP\d+)? rel=\S+ max_abs_diff=\S+ FAIL", out), out
    assert re.search(rf"^tb2: deploy {bad_id} -> FAIL \(pre-restart parity L\d+ rel=[\d.]+", out, re.M), out
    assert re.search(r"✗ parity", out) and not re.search(r"✓ (parity|gate)\b.*FAIL", out), out
    assert not re.search(r"^\s*\S* ?switch\b.*current ->", out.split("gate rules:")[1], re.M), out  # nothing switched

    status = opsctl(testbed, "status", "tb2")
    assert f"current release: {good_id}" in status.stdout and "last verdict: FAIL" in status.stdout, status.stdout

    refused = opsctl(testbed, "deploy", "tb2", "--src", str(bad), "--yes")
    assert refused.returncode == 30
    assert f"release {bad_id} is marked bad there (pre-restart parity L" in refused.stderr, refused.stderr

    nothing = opsctl(testbed, "logs", "tb2", "--grep", "no-line-says-this-.*-ever")
    assert nothing.returncode == 0
    assert (
        "tb2: no journal line of sglang-k26-ddtree.service matched --grep no-line-says-this-.*-ever" in nothing.stdout
    )
    assert "in the last 200 lines" in nothing.stdout
