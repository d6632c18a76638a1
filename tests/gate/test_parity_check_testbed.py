"""`opsctl parity check` on a real journal (testbed host tb1, systemd + journald): a good release, a bad one (the
classic bug, FAIL, rolled back) and the rollback. The offline check finds the invocations and judges the last,
reads journalctl's text and JSON and `opsctl logs --grep parity --raw|--json` piped, and the shapes line of the bad
release (bs 2) carries the classic-bug warning."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from opsctl import pipeline as d
from opsctl.inventory import HostConfig, Inventory
from opsctl.ssh import connect
from tests.pipeline import trees
from tests.pipeline.test_testbed_deploy import ensure_good, fast, opsctl


def check(text: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "opsctl", "parity", "check", "-", *args],
        input=text,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=trees.REPO,
        check=False,
    )


@pytest.fixture
def tb1(testbed: Inventory) -> HostConfig:
    return fast(testbed.host("tb1"))


def test_offline_check_on_a_real_journal(tb1: HostConfig, good_tree: Path, good_id: str, tmp_path: Path) -> None:
    ensure_good(tb1, good_tree, good_id)
    bad = trees.classic_bug(tmp_path / "bug")
    res = d.deploy(tb1, bad, d.DeployOptions(skip_prerestart_parity=True, force=True))
    assert res.verdict == "FAIL" and res.rollback_verdict == "PASS", res.line()
    tp = str(tb1.service.tp)
    with connect(tb1) as r:
        unit = f"{tb1.unit}.service"
        short = r.run(f"journalctl -u {unit} -o short-iso --no-pager -q -n 20000", timeout=120).stdout
        as_json = r.run(f"journalctl -u {unit} -o json --no-pager -q -n 20000", timeout=120).stdout

    # The last invocation is the rollback's good release: PASS; --all shows the bad one before it.
    doc = json.loads(check(short, "--tp", tp, "--json", "--all").stdout)
    assert doc["verdict"] == "PASS", doc["reason"]
    assert doc["invocations_seen"] >= 2 and "FAIL" in [i["verdict"] for i in doc["invocations"]]
    failed = [i for i in doc["invocations"] if i["verdict"] == "FAIL"][-1]
    assert json.loads(check(as_json, "--tp", tp, "--json").stdout)["verdict"] == "PASS"

    # Cut right after the bad release's run: that run is the verdict (it used to be the first invocation's PASS).
    cut = "\n".join(short.split("\n")[: int(failed["last_line"])]) + "\n"
    res_cut = check(cut, "--tp", tp)
    assert res_cut.returncode == 31 and "gate: FAIL" in res_cut.stdout, res_cut.stdout
    assert f"invocation {failed['index']} of {failed['index']}" in res_cut.stdout

    # opsctl logs --grep parity --raw (the journal's text, what `parity check -` reads; piped without --raw, logs
    # decodes its lines for people and log collectors) and --json, into the check: the journal's own verdict.
    for extra in (["--raw"], ["--json"]):
        logs = opsctl("logs", "tb1", "--grep", "parity", "--lines", "20000", *extra)
        assert logs.returncode == 0, logs.stderr
        piped = json.loads(check(logs.stdout, "--tp", tp, "--json", "--all").stdout)
        assert piped["verdict"] == doc["verdict"] and piped["summary"]["ignored"] == 0, piped
        assert "FAIL" in [i["verdict"] for i in piped["invocations"]]

    # The bad release's shapes line (bs 2 on the testbed) is flagged.
    shapes = opsctl("logs", "tb1", "--grep", "shapes", "--lines", "20000")
    assert "classic marshaling bug" in shapes.stdout, shapes.stdout[-2000:]
