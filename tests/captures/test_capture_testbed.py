"""Issue 19 on a real testbed host, through the CLI: the unit (the stand-in server, serving requests sent on the
host meanwhile) captures its verify calls when armed (`opsctl capture`), `opsctl captures` lists and prunes them, `opsctl parity replay` replays them with the running
release (PASS) and with a classic-bug release that sits on the host unswitched (FAIL, naming the captures)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from opsctl.inventory import Inventory
from opsctl.release import make_manifest
from opsctl.ssh import connect
from opsctl.testbed import reset_host
from tests.cli.test_first_hour_cli import opsctl
from tests.pipeline import trees
from tests.probe.host_traffic import traffic

REPO = Path(__file__).resolve().parents[2]
HOST = "tb1"

pytestmark = pytest.mark.skipif(
    not (trees.SOURCE / "backend/kdtree_backend/capture.py").exists(), reason="backend capture.py not in the tree"
)


def test_capture_list_replay_and_prune_on_a_testbed_host(testbed: Inventory, tmp_path: Path) -> None:
    host = testbed.host(HOST)
    reset_host(host)
    good = trees.copy_tree(tmp_path / "good", tag="capture-good")
    good_id = make_manifest(good).id
    deployed = opsctl(testbed, "deploy", HOST, "--src", str(good), "--yes")
    assert deployed.returncode == 0, deployed.stdout + deployed.stderr

    # Arm, wait, report: 2 TP ranks x 2 layers x 2 steps.
    with traffic(host):  # the server verifies (and captures) only while it serves
        taken = opsctl(testbed, "capture", HOST, "--layers", "0,30", "--steps", "2", "--json", timeout=300)
    assert taken.returncode == 0, taken.stdout + taken.stderr
    doc = json.loads(taken.stdout)
    capture_id = doc["id"]
    assert doc["calls"] == 8 and doc["ranks_done"] == [0, 1] and doc["layers"] == [0, 30]
    assert doc["releases"] == [good_id] and doc["problem"] is None and doc["bytes"] > 0
    assert re.search(
        rf"capture {capture_id}: \d+ call\(s\) stored, [\d.]+ MB, \d/2 TP rank\(s\) finished", taken.stderr
    )
    directory = f"{host.root}/state/capture"
    with connect(host) as r:
        modes = set(r.run(f"find {directory} -mindepth 1 -printf '%m %y\\n'").stdout.split("\n")) - {""}
        request_left = r.run(f"test -e {directory}/request.json", check=False).rc == 0
    assert modes == {"700 d", "600 f"}, modes  # root-only: activations derive from users' prompts
    assert not request_left  # disarmed once every rank had finished

    listed = opsctl(testbed, "captures", HOST, "--json")
    assert listed.returncode == 0, listed.stderr
    (entry,) = json.loads(listed.stdout)["captures"]
    assert entry["id"] == capture_id and entry["calls"] == 8 and entry["bytes"] == doc["bytes"]
    assert entry["releases"] == [good_id] and entry["age_s"] < 300
    table = opsctl(testbed, "captures", HOST)
    assert re.search(rf"{capture_id} .* {good_id} .* 2/2 .* 8 .* 0,30 .* MB .* complete", table.stdout), table.stdout

    # The running release replays its own captures: PASS, every line naming its capture.
    replayed = opsctl(testbed, "parity", "replay", HOST, "--json")
    assert replayed.returncode == 0, replayed.stdout + replayed.stderr
    result = json.loads(replayed.stdout)
    assert result["verdict"] == "PASS" and result["release"] == good_id and len(result["lines"]) == 8
    assert {line["capture"].split("/")[0] for line in result["lines"]} == {capture_id}
    assert {line["tp"] for line in result["lines"]} == {0, 1} and max(line["rel"] for line in result["lines"]) < 0.01

    # A classic-bug release: the deploy replays the host's captured calls with it first and stops there, before
    # the switch, naming the failure as the capture replay's.
    bad = trees.classic_bug(tmp_path / "bad", tag="capture-bug")
    bad_id = make_manifest(bad).id
    refused = opsctl(testbed, "deploy", HOST, "--src", str(bad), "--yes")
    assert refused.returncode == 31, refused.stdout + refused.stderr
    assert re.search(rf"deploy {bad_id} -> FAIL \(pre-restart capture replay L0 TP\d rel=", refused.stdout), (
        refused.stdout
    )
    with connect(host) as r:
        assert r.run(f"readlink {host.root}/current").stdout.strip() == f"releases/{good_id}"  # never switched
    caught = opsctl(testbed, "parity", "replay", HOST, "--release", bad_id)
    assert caught.returncode == 31, caught.stdout + caught.stderr
    fails = re.findall(
        rf"^FAIL L(\d+) TP(\d) {capture_id}/tp\d-L\d+-s\d+: rel ([\d.]+) >= fail threshold", caught.stdout, re.M
    )
    assert len(fails) == 8 and all(float(rel) > 0.3 for *_, rel in fails), caught.stdout
    assert f"parity replay of {bad_id} -> FAIL" in caught.stdout and "error:" in caught.stderr
    missing = opsctl(testbed, "parity", "replay", HOST, "--release", "r000000000000")
    assert missing.returncode == 2 and "is not on the host" in missing.stderr

    # A budget too small for one call: nothing stored, and the error says what to raise it to.
    with traffic(host):
        small = opsctl(testbed, "capture", HOST, "--max-mb", "0.05", "--layers", "0", timeout=300)
    assert small.returncode == 1, small.stdout + small.stderr
    assert re.search(
        r"stored nothing \(max_bytes\): one call needs [\d.]+ MB per rank: raise --max-mb above", small.stderr
    )

    pruned = opsctl(testbed, "captures", HOST, "--prune", "--keep", "0", "--json")
    assert pruned.returncode == 0, pruned.stderr
    gone = json.loads(pruned.stdout)
    assert capture_id in {p["id"] for p in gone["pruned"]} and gone["captures"] == []
    with connect(host) as r:
        left = r.run(f"ls -A {directory}").stdout.split()
    assert left == [], left
