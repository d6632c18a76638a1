"""`opsctl deploy|rollback|status GROUP` through the real CLI on testbed hosts: the fleet path of the deploy
command (opsctl.fleet.rollout over the single-host pipeline). The fault matrix (tests/fault) drives the same roll-out
library through its failure scenarios; here the CLI wiring is what is under test."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import yaml

from opsctl.inventory import HostConfig, Inventory
from opsctl.release import make_manifest
from opsctl.ssh import connect
from opsctl.testbed import Testbed, reset_host
from tests.pipeline import trees
from tests.pipeline.test_testbed_deploy import opsctl, state


def fleet_hosts() -> list[HostConfig]:
    """The group as the CLI reads it: the testbed's inventory file now (the fault matrix adds tb3 to it after the
    session's ``testbed`` fixture was read)."""
    return Testbed().inventory().resolve("fleet")


def test_single_host_refuses_group_options(testbed: Inventory) -> None:  # the CLI reads the testbed inventory
    res = opsctl("deploy", "local", "--canary", "tb1", "--dry-run")
    assert res.returncode == 2
    assert "single host" in res.stderr


def test_group_dry_run_prints_the_plan_and_touches_nothing(testbed: Inventory) -> None:
    before = {h.name: state(h)[0].current for h in fleet_hosts()}
    res = opsctl("deploy", "fleet", "--dry-run", "--canary", "tb2", "--batch", "1")
    assert res.returncode == 0, res.stderr
    assert "canary: tb2" in res.stdout and "batch 1: tb1" in res.stdout
    assert {h.name: state(h)[0].current for h in fleet_hosts()} == before


def without_speed_checks_file(tmp_path: Path) -> Path:
    """The testbed's inventory file with ``gate.compare.enabled: false`` and ``gate.speed.enabled: false`` for every
    host: three hosts deploying at once on two cores are no place to judge speed (before or after the restart),
    and it is not what this test is about."""
    doc = yaml.safe_load(Testbed().inventory_path.read_text())
    gate = doc["defaults"].setdefault("gate", {})
    gate["compare"] = {"enabled": False}
    gate["speed"] = {"enabled": False}
    path = tmp_path / "inventory.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_group_deploy_parallel_then_status_and_rollback(testbed: Inventory, tmp_path: Path) -> None:
    hosts = fleet_hosts()
    inv = without_speed_checks_file(tmp_path)

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return opsctl(*args, inventory=inv)

    for h in hosts:
        reset_host(h)
    first = trees.copy_tree(tmp_path / "first", "fleet-first")
    second = trees.copy_tree(tmp_path / "second", "fleet-second")
    first_id, second_id = make_manifest(first).id, make_manifest(second).id

    for tree in (first, second):
        res = cli("deploy", "fleet", "--yes", "--parallel", "--batch", "50%", "--src", str(tree))
        assert res.returncode == 0, res.stdout + res.stderr
        assert "roll-out complete" in res.stdout
    for h in hosts:
        snap, history = state(h)
        assert snap.current == second_id and snap.last_good == second_id
        assert snap.unit.active_state == "active" and not snap.lock_present
        assert [e.verdict for e in history if e.event == "deploy"][-2:] == ["PASS", "PASS"]

    st = cli("status", "fleet", "--json")
    assert st.returncode == 0, st.stderr
    docs = json.loads(st.stdout)
    assert [d["host"] for d in docs] == [h.name for h in hosts]
    assert all(d["current"] == second_id and d["unit"]["active"] == "active" for d in docs)

    rb = cli("rollback", "fleet", "--yes", "--parallel")
    assert rb.returncode == 0, rb.stdout + rb.stderr
    for h in hosts:
        snap, _ = state(h)
        assert snap.current == first_id and snap.unit.active_state == "active" and not snap.lock_present

    # An operator's stop is not evidence against the release: reported (WARN), never rolled back.
    sick = hosts[0]
    with connect(sick) as r:
        r.run(["systemctl", "stop", sick.unit + ".service"], timeout=120)
    stopped = cli("health", sick.name, "--rollback-on-fail", "--json", "--no-alerts")
    assert stopped.returncode == 1, stopped.stdout + stopped.stderr
    assert json.loads(stopped.stdout)["rollbacks"] == []
    assert state(sick)[0].current == first_id
    # A release that dies in service (a crash loop): health finds it (CRIT) and --rollback-on-fail acts on it.
    with connect(sick) as r:
        r.run(
            # rm first: releases share unchanged files through hard links, and only this one may break
            f'f={sick.root}/current/backend/kdtree_backend/serve.py; rm -f "$f" && echo \'raise SystemExit(1)\' > "$f" && '
            f"systemctl restart {sick.unit}.service",
            timeout=120,
            check=False,
        )
    deadline = time.monotonic() + 90  # systemd gives up after StartLimitBurst quick failures: "failed"
    while state(sick)[0].unit.active_state != "failed" and time.monotonic() < deadline:
        time.sleep(0.5)
    assert state(sick)[0].unit.active_state == "failed"
    hr = cli("health", sick.name, "--rollback-on-fail", "--json", "--no-alerts")
    assert hr.returncode == 2, hr.stdout + hr.stderr  # the CRIT found is still reported
    doc = json.loads(hr.stdout)
    assert [(x["host"], x["ok"]) for x in doc["rollbacks"]] == [(sick.name, True)], doc["rollbacks"]
    snap, _ = state(sick)
    assert snap.current == second_id and snap.unit.active_state == "active" and not snap.lock_present
