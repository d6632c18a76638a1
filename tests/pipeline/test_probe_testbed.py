"""The gate's own verify traffic against real testbed hosts running the SGLang stand-in (kdtree_backend.serve, a
3 s model load): the probe waits for readiness and drives the parity lines with no other traffic; each verdict of
docs/gate.md's probe rules, with the host's end state; the API key stays on the host; `opsctl health --probe`.

The host's service is switched to ``mode: standin`` here (whatever the testbed inventory says), with an API key
in ``/etc/kdtree-engine/sglang.env`` that the stand-in requires and the probe reads on the host.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from opsctl import pipeline as d
from opsctl.health.checks import evaluate
from opsctl.health.levels import Level
from opsctl.health.probe import ssh_probe
from opsctl.host import releaseroot
from opsctl.inventory import HostConfig, Inventory
from opsctl.release import make_manifest
from opsctl.ssh import connect
from opsctl.testbed import reset_host
from tests.builders import without_comparison
from tests.pipeline import trees
from tests.pipeline.test_testbed_deploy import Recorder, state

ENV_FILE = "/etc/kdtree-engine/sglang.env"
KEY = "sk-testbed-probe-7f3a9c2e51"
LOAD_DELAY_S = 3
HOST = "tb2"

pytestmark = pytest.mark.skipif(
    not (trees.SOURCE / "backend/kdtree_backend/serve.py").exists(), reason="the stand-in server is not in the tree"
)


def standin(host: HostConfig, **probe: Any) -> HostConfig:
    """The host running the stand-in with a 3 s load, a short gate, and the probe (``probe`` overrides); without
    the comparison, which these tests are not about."""
    host = without_comparison(host)
    svc = host.service.model_copy(
        update={"mode": "standin", "standin_args": ["--load-delay", str(LOAD_DELAY_S)], "environment_file": ENV_FILE}
    )
    gate = host.gate.model_copy(
        update={
            "deadline_s": 60.0,
            "poll_interval_s": 0.5,
            "max_restarts": 2,
            "probe": host.gate.probe.model_copy(update={"parity_grace_s": 8.0, **probe}),
        }
    )
    return host.model_copy(update={"service": svc, "gate": gate})


def with_fault(dest: Path, fault: str) -> Path:
    """A release whose stand-in injects ``fault`` (deploy/kdtree.json ``standin.fault``)."""
    tree = trees.copy_tree(dest, f"fault-{fault}")
    cfg = tree / "deploy" / "kdtree.json"
    doc = json.loads(cfg.read_text())
    doc.setdefault("standin", {})["fault"] = fault
    cfg.write_text(json.dumps(doc, indent=2) + "\n")
    return tree


@pytest.fixture(scope="module")
def tb(testbed: Inventory) -> Iterator[HostConfig]:
    host = standin(testbed.host(HOST))
    with connect(host) as r:
        r.run(f"mkdir -p {os.path.dirname(ENV_FILE)}", timeout=30)
        r.write_file(ENV_FILE, f"SGLANG_API_KEY={KEY}\n".encode(), mode=0o600)
    yield host
    reset_host(host)  # no stand-in release left behind for the next module's tests
    with connect(host) as r:
        r.run(f"rm -f {ENV_FILE}", timeout=30)


@pytest.fixture(scope="module")
def good_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return trees.copy_tree(tmp_path_factory.mktemp("probe-good"), "probe-good")


@pytest.fixture(scope="module")
def good_id(good_tree: Path) -> str:
    return make_manifest(good_tree).id


def ensure_good(host: HostConfig, tree: Path, rid: str) -> None:
    snap, _ = state(host)
    if snap.current == rid and snap.unit.active_state == "active" and snap.last_good == rid and not snap.lock_present:
        return
    if rid in snap.releases and rid not in snap.bad and snap.is_managed and not snap.lock_present:
        if d.rollback(host, to=rid).verdict == "PASS":
            return
    reset_host(host)
    res = d.deploy(host, tree, d.DeployOptions())
    assert res.verdict == "PASS", res.line()


def assert_no_key(*texts: object) -> None:
    for text in texts:
        assert KEY not in (text if isinstance(text, str) else json.dumps(text, default=str))


def measure(what: str, res: d.DeployResult) -> None:
    probe = (res.gate or {}).get("probe") or {}
    print(
        f"\n[measure] {what}: {res.verdict} in {res.elapsed_s:.1f}s; ready {probe.get('ready_after_s')}s after the "
        f"restart, verdict {probe.get('verdict_after_ready_s')}s after ready; probe {probe.get('sent')} sent, "
        f"{probe.get('answered')} answered in {probe.get('waves')} wave(s), TTFT {probe.get('ttft_ms')}; "
        f"steps { {k: round(v, 1) for k, v in res.step_times.items()} }"
    )


# ------------------------------------------------------------------------------------------------ verdicts


def test_a_good_release_passes_through_its_own_probes_with_no_other_traffic(
    tb: HostConfig, good_tree: Path, good_id: str
) -> None:
    reset_host(tb)
    rec = Recorder()
    res = d.deploy(tb, good_tree, d.DeployOptions(), rec)
    assert res.verdict == "PASS", res.line()
    probe = res.gate["probe"] if res.gate else {}
    assert probe["answered"] == probe["sent"] >= 1 and probe["failed"] == 0 and probe["api_key"] is True
    assert probe["ready_after_s"] >= LOAD_DELAY_S - 0.5 and probe["verdict_after_ready_s"] <= 10.0
    assert probe["ttft_ms"]["min"] > 0
    assert any(i.startswith("probe: the server is ready") for i in rec.infos)
    assert any(i.startswith("probe wave 1: ") for i in rec.infos)
    snap, history = state(tb)
    assert snap.current == snap.last_good == good_id and snap.unit.active_state == "active"
    assert history[-1].verdict == "PASS" and history[-1].gate["probe"] == probe
    assert_no_key(rec.infos, res.line(), history)
    measure("good release", res)


def test_the_seed_bug_fails_on_the_probe_driven_lines_and_is_rolled_back(
    tb: HostConfig, good_tree: Path, good_id: str, tmp_path: Path
) -> None:
    ensure_good(tb, good_tree, good_id)
    bad = trees.classic_bug(tmp_path / "bug")
    res = d.deploy(tb, bad, d.DeployOptions(skip_prerestart_parity=True))
    assert res.verdict == "FAIL" and "parity" in res.reason, res.line()
    assert res.rolled_back_to == good_id and res.rollback_verdict == "PASS"
    snap, history = state(tb)
    assert snap.current == good_id and make_manifest(bad).id in snap.bad and snap.unit.active_state == "active"
    assert history[-1].event == "rollback" and history[-1].gate["probe"]["answered"] >= 1  # its own probes
    measure("classic bug", res)


def test_probe_disabled_on_an_idle_host_is_unproven_not_bad_and_a_redeploy_is_accepted(
    tb: HostConfig, good_tree: Path, good_id: str, tmp_path: Path
) -> None:
    ensure_good(tb, good_tree, good_id)
    idle = standin(tb, enabled=False).model_copy(
        update={"gate": standin(tb, enabled=False).gate.model_copy(update={"deadline_s": 12.0})}
    )
    tree = trees.copy_tree(tmp_path / "unproven", "probe-unproven")
    rid = make_manifest(tree).id
    res = d.deploy(idle, tree, d.DeployOptions(skip_prerestart_parity=True))
    assert res.verdict == "UNPROVEN" and res.verdict.exit_code == 32, res.line()
    assert "no verify traffic; enable gate.probe or deploy under load" in res.reason
    assert res.rolled_back_to == good_id
    snap, history = state(tb)
    assert snap.current == good_id and rid not in snap.bad and snap.unit.active_state == "active"
    assert [h.verdict for h in history[-2:]] == ["UNPROVEN", res.rollback_verdict]
    again = d.deploy(tb, tree, d.DeployOptions(skip_prerestart_parity=True))  # accepted: not marked bad
    assert again.verdict == "PASS", again.line()


@pytest.mark.parametrize(
    ("fault", "reason"),
    [
        ("http-500", "probe requests failed"),
        ("silent-rank:1", "TP rank(s) 1 of 2 printed no parity line within 8s of the first answer"),
    ],
)
def test_a_release_that_cannot_serve_or_verify_fails_and_is_rolled_back(
    tb: HostConfig, good_tree: Path, good_id: str, tmp_path: Path, fault: str, reason: str
) -> None:
    ensure_good(tb, good_tree, good_id)
    tree = with_fault(tmp_path / "fault", fault)
    res = d.deploy(tb, tree, d.DeployOptions(skip_prerestart_parity=True))
    assert res.verdict == "FAIL" and reason in res.reason, res.line()
    if fault == "http-500":
        assert "HTTP 500" in res.reason
    assert res.rolled_back_to == good_id and res.rollback_verdict == "PASS"
    snap, _ = state(tb)
    assert snap.current == good_id and make_manifest(tree).id in snap.bad and snap.unit.active_state == "active"
    measure(f"fault {fault}", res)


# ------------------------------------------------------------------------------------------------ the CLI and the key


def inventory_file(tmp_path: Path, testbed: Inventory) -> Path:
    """The testbed inventory with this module's host settings, for the CLI."""
    doc = yaml.safe_load(Path(testbed.path).read_text())
    over = doc["hosts"][HOST]
    over["service"] = {
        **over.get("service", {}),
        "mode": "standin",
        "standin_args": ["--load-delay", str(LOAD_DELAY_S)],
        "environment_file": ENV_FILE,
    }
    # Not about the comparison (tests/pipeline/test_testbed_comparison.py is): two A/A deploys here, off.
    over["gate"] = {
        "deadline_s": 60,
        "poll_interval_s": 0.5,
        "probe": {"parity_grace_s": 8},
        "compare": {"enabled": False},
    }
    path = tmp_path / "inventory.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def opsctl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "opsctl", *args], capture_output=True, text=True, timeout=300, check=False
    )


def test_the_cli_shows_the_probe_and_never_the_api_key(
    tb: HostConfig, testbed: Inventory, good_tree: Path, good_id: str, tmp_path: Path
) -> None:
    ensure_good(tb, good_tree, good_id)
    inv = str(inventory_file(tmp_path, testbed))
    plan = opsctl("deploy", HOST, "--dry-run", "--force", "--src", str(good_tree), "--inventory", inv)
    assert plan.returncode == 0, plan.stderr
    assert "POST /generate" in plan.stdout and f"$SGLANG_API_KEY in {ENV_FILE}" in plan.stdout
    out = opsctl("deploy", HOST, "--force", "--yes", "--json", "--src", str(good_tree), "--inventory", inv)
    assert out.returncode == 0, out.stdout + out.stderr
    doc = json.loads(out.stdout)
    assert doc["verdict"] == "PASS" and doc["gate"]["probe"]["answered"] >= 1
    shown = opsctl("deploy", HOST, "--force", "--yes", "--src", str(good_tree), "--inventory", inv)
    assert shown.returncode == 0 and "probe wave 1:" in shown.stdout and "; probe: " in shown.stdout
    status = opsctl("status", HOST, "--inventory", inv)
    # The verdict and its restart times from one record, on one line (issue 38).
    assert re.search(r"^last verdict: PASS \(deploy .*\); ready [\d.]+s after the restart", status.stdout, re.M), (
        status.stdout
    )
    _, history = state(tb)
    assert_no_key(plan.stdout, plan.stderr, out.stdout, out.stderr, shown.stdout, shown.stderr, status.stdout, history)


# ------------------------------------------------------------------------------------------------ health --probe


def test_health_probe_passes_on_a_healthy_host_and_is_crit_when_the_verify_path_fails(
    tb: HostConfig, good_tree: Path, good_id: str, tmp_path: Path
) -> None:
    ensure_good(tb, good_tree, good_id)
    good = evaluate(tb, ssh_probe(tb, probe=True)).check("probe")
    assert good is not None and good.level is Level.OK, good
    assert "from each of 2 rank(s) pass" in good.detail
    # A release whose rank 1 prints nothing (marked bad by the test above: forced), left running: staged, restarted
    # without a rollback.
    silent = with_fault(tmp_path / "silent", "silent-rank:1")
    assert (
        d.deploy(tb, silent, d.DeployOptions(no_restart=True, skip_prerestart_parity=True, force=True)).verdict
        == "STAGED"
    )
    assert d.restart(tb).verdict == "FAIL"
    bad = evaluate(tb, ssh_probe(tb, probe=True)).check("probe")
    assert bad is not None and bad.level is Level.CRIT, bad
    assert "TP rank(s) 1 of 2 printed no fresh parity line" in bad.detail
    with connect(tb) as r:
        assert releaseroot.read_snapshot(r, tb.root, tb.unit).current == make_manifest(silent).id
    ensure_good(tb, good_tree, good_id)
