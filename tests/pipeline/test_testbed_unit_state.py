"""Issue 36 items 4 and 5 on a real testbed host: UP-TO-DATE only for a release that is current, passed its last
gate and runs; a rollback never drops the inventory's EnvironmentFile (the API key).

One host (``local``) carries both tests in turn: the first leaves it on the good release, gated PASS, which the
second starts from."""

from __future__ import annotations

from pathlib import Path

import pytest

from opsctl import pipeline as d
from opsctl.inventory import HostConfig, Inventory
from opsctl.ssh import connect
from opsctl.testbed import reset_host
from tests.pipeline import trees
from tests.pipeline.test_testbed_deploy import ensure_good, fast, state

ENV_FILE = "/etc/kdtree-engine-issue36.env"


@pytest.fixture
def local(testbed: Inventory) -> HostConfig:
    return fast(testbed.host("local"))


def without_probe(host: HostConfig) -> HostConfig:
    probe = host.gate.probe.model_copy(update={"enabled": False})
    return host.model_copy(update={"gate": host.gate.model_copy(update={"probe": probe})})


def test_unproven_first_deploy_is_not_up_to_date(local: HostConfig, good_tree: Path, good_id: str) -> None:
    """A host with no earlier release, a deploy that ends UNPROVEN (no traffic: the probe disabled): the unit is
    stopped (and disabled) and no release is current (issue 47, item 8: a reboot must not start it). A plain
    redeploy deploys again instead of answering UP-TO-DATE."""
    reset_host(local)
    quick = d.DeployOptions(gate_timeout_s=4, skip_prerestart_parity=True)
    first = d.deploy(without_probe(local), good_tree, quick)
    assert first.verdict == "UNPROVEN", first.line()
    snap, _ = state(local)
    assert snap.current is None and snap.unit.active_state != "active"
    again = d.deploy(local, good_tree, d.DeployOptions(skip_prerestart_parity=True))
    assert again.verdict == "PASS", again.line()  # deployed and gated again, not UP-TO-DATE
    assert again.step_times.get("gate") is not None and again.step_times.get("upload") is not None
    snap, _ = state(local)
    assert snap.current == good_id and snap.unit.active_state == "active" and snap.last_good == good_id
    # Now all three hold: nothing to do.
    assert d.deploy(local, good_tree, d.DeployOptions()).verdict == "UP-TO-DATE"


def test_rollback_after_a_failed_deploy_keeps_the_environment_file(
    local: HostConfig, good_tree: Path, good_id: str, tmp_path: Path
) -> None:
    """The good release was deployed while the inventory had no environment_file (its stored unit.service has
    none). The inventory gains one; a crash-looping release fails its gate and the automatic rollback puts the good
    release back: its unit is rendered from today's inventory, so the service runs with the file's variables."""
    ensure_good(local, good_tree, good_id)
    with connect(local) as r:
        stored = r.read_file(f"{local.root}/releases/{good_id}/unit.service").decode()
        r.write_file(ENV_FILE, "KDTREE_ISSUE36_MARK=from-inventory\n", mode=0o600)
    assert ENV_FILE not in stored  # the trap: the old release's own unit lacks it
    today = local.model_copy(update={"service": local.service.model_copy(update={"environment_file": ENV_FILE})})
    try:
        res = d.deploy(today, trees.crash_loop(tmp_path / "crash", tag="issue36-env"), d.DeployOptions())
        assert res.verdict == "FAIL", res.line()
        assert res.rolled_back_to == good_id and res.rollback_verdict == "PASS", res.line()
        with connect(local) as r:
            unit = r.read_file(f"/etc/systemd/system/{local.unit}.service").decode()
            pid = r.run(f"systemctl show -p MainPID --value {local.unit}.service", timeout=30).stdout.strip()
            environ = r.run(f"tr '\\0' '\\n' < /proc/{pid}/environ", timeout=30).stdout
        assert f"EnvironmentFile={ENV_FILE}\n" in unit  # without '-': not optional (issue 47)
        assert "KDTREE_ISSUE36_MARK=from-inventory" in environ.split("\n")
        snap, _ = state(local)
        assert snap.current == good_id and snap.unit.active_state == "active"
    finally:
        with connect(local) as r:
            r.run(["rm", "-f", "--", ENV_FILE], timeout=30)
