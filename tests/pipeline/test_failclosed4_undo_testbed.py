"""Issue 47 ("fail closed, round 4") items 2, 6, 7 and 8 on real testbed hosts: a deploy never leaves a unit stopped
that was serving when it began; a release is never last good and bad at once, and a later PASS clears its bad mark;
UP-TO-DATE only for the invocation a gate judged; an UNPROVEN first deploy leaves nothing a reboot would start.

The pure decisions behind them: tests/pipeline/test_undo_plan.py."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from opsctl import pipeline as d
from opsctl.host.history import HistoryEvent
from opsctl.inventory import HostConfig, Inventory
from opsctl.ssh import connect
from opsctl.testbed import Testbed, reset_host
from tests.cli.test_first_hour_cli import opsctl
from tests.pipeline.test_testbed_deploy import ensure_good, state
from tests.pipeline.test_testbed_unit_state import without_probe


def strict(host: HostConfig) -> HostConfig:
    """The same host under thresholds its good release cannot meet (the issue's `gate: {pass_rel: 0.0001,
    fail_rel: 0.001}`)."""
    return host.model_copy(update={"gate": host.gate.model_copy(update={"pass_rel": 1e-4, "fail_rel": 1e-3})})


def sh(host: HostConfig, command: str) -> str:
    with connect(host) as r:
        return r.run(command, timeout=60, check=False).stdout.strip()


def unit_file(host: HostConfig) -> str:
    return sh(host, f"cat /etc/systemd/system/{host.unit}.service")


def views(testbed: Inventory, name: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """`opsctl releases NAME --json` and `opsctl status NAME --json`, as an operator runs them."""
    rel = opsctl(testbed, "releases", name, "--json", timeout=120)
    assert rel.returncode == 0, rel.stdout + rel.stderr
    st = opsctl(testbed, "status", name, "--json", timeout=120)
    assert st.stdout.strip(), st.stderr
    return json.loads(rel.stdout), json.loads(st.stdout)


def assert_never_good_and_bad(testbed: Inventory, name: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    rows, status = views(testbed, name)
    for row in rows:
        assert not {"last-good", "bad"} <= set(row["flags"]), row
    doc = status[0] if isinstance(status, list) else status
    assert doc["last_good"] is None or doc["last_good"] not in doc["bad"], doc
    return rows, doc


# ------------------------------------------------------------------------------------------------ items 2 and 7


def test_forced_redeploy_of_the_only_good_release_that_fails_keeps_it_serving(
    testbed: Inventory, tb1: HostConfig, good_tree: Path, good_id: str
) -> None:
    """Item 2: `deploy --force` of the running (only good) release under stricter thresholds FAILs: the unit serves
    the release again (restarted with the unit it ran with), the summary says so, and no view shows the release as
    last good and bad at once. Item 7: a later PASS of it (a restart under the usual thresholds) clears the mark."""
    reset_host(tb1)
    first = d.deploy(tb1, good_tree, d.DeployOptions(skip_prerestart_parity=True))
    assert first.verdict == "PASS", first.line()
    unit_before = unit_file(tb1)
    before, _ = state(tb1)

    res = d.deploy(strict(tb1), good_tree, d.DeployOptions(force=True, skip_prerestart_parity=True))
    assert res.verdict == "FAIL", res.line()
    assert res.verdict.exit_code == 31
    assert res.rolled_back_to == good_id and res.rollback_verdict == "restarted, not gated", res.line()
    assert f"rolled back to {good_id} (what served before)" in res.line()
    snap, history = state(tb1)
    assert snap.current == good_id and snap.unit.active_state == "active", snap.unit
    assert snap.unit.invocation_id != before.unit.invocation_id  # restarted, not left stopped
    assert good_id in snap.bad and snap.last_good is None and not snap.lock_present
    assert unit_file(tb1) == unit_before
    assert sh(tb1, f"systemctl is-enabled {tb1.unit}.service") == "enabled"
    assert [(h.event, h.verdict) for h in history[-2:]] == [
        (HistoryEvent.DEPLOY, "FAIL"),
        (HistoryEvent.ROLLBACK, "DONE"),
    ]
    assert history[-1].rolled_back_from == good_id and history[-1].automatic
    rows, doc = assert_never_good_and_bad(testbed, "tb1")
    assert doc["current"] == good_id and good_id in doc["bad"] and doc["last_good"] is None
    assert next(r for r in rows if r["id"] == good_id)["flags"] == ["current", "bad"]

    # Item 7: the same release passes again (the usual thresholds): its bad mark goes, the history keeps both.
    again = d.restart(tb1)
    assert again.verdict == "PASS", again.line()
    snap, history = state(tb1)
    assert snap.last_good == good_id and good_id not in snap.bad
    verdicts = [h.verdict for h in history if h.release == good_id and h.verdict is not None]
    assert verdicts[-3:] == ["FAIL", "DONE", "PASS"]
    rows, doc = assert_never_good_and_bad(testbed, "tb1")
    assert doc["last_good"] == good_id and good_id not in doc["bad"]
    assert "bad" not in next(r for r in rows if r["id"] == good_id)["flags"]
    # And it is deployable without --force again (not marked bad): up to date, its invocation gated by the restart.
    assert d.deploy(tb1, good_tree, d.DeployOptions()).verdict == "UP-TO-DATE"


def test_a_changed_tp_that_fails_restarts_what_served_before(
    testbed: Inventory, tb1: HostConfig, good_tree: Path, good_id: str
) -> None:
    """Item 2, the other way: the running release deployed again (--force) under `service.tp: 8` instead of 2. The
    stand-in then serves 8 ranks, whose parity passes, but its answers differ from TP 2's: the comparison FAILs it.
    The unit comes back as it served, with TP 2 (its own unit file, not the template under today's inventory),
    never stopped."""
    ensure_good(tb1, good_tree, good_id)
    if "--tp-size 2" not in unit_file(tb1):  # an earlier run left another unit: start from a plain deploy
        reset_host(tb1)
        ensure_good(tb1, good_tree, good_id)
    unit_before = unit_file(tb1)
    assert "--tp-size 2" in unit_before
    # The comparison on (fast() leaves it out): it is what tells TP 8's answers from TP 2's.
    base = testbed.host("tb1")
    tp8 = base.model_copy(update={"service": base.service.model_copy(update={"tp": 8}), "gate": tb1.gate})
    tp8 = tp8.model_copy(update={"gate": tp8.gate.model_copy(update={"compare": base.gate.compare})})
    res = d.deploy(tp8, good_tree, d.DeployOptions(force=True, skip_prerestart_parity=True))
    assert res.verdict == "FAIL" and res.stage == "comparison", res.line()
    assert res.rolled_back_to == good_id and res.rollback_verdict == "restarted, not gated", res.line()
    snap, _ = state(tb1)
    assert snap.current == good_id and snap.unit.active_state == "active", snap.unit
    assert unit_file(tb1) == unit_before  # TP 2, as it served
    assert_never_good_and_bad(testbed, "tb1")
    ensure_good(tb1, good_tree, good_id)


# ------------------------------------------------------------------------------------------------ item 6


def test_a_unit_systemd_restarted_by_itself_is_not_up_to_date(tb2: HostConfig, good_tree: Path, good_id: str) -> None:
    """After `systemctl kill -s KILL`, systemd starts the unit again (Restart=): the release is current, its last
    gate passed and the unit is active, but that invocation was never gated, so a deploy gates it."""
    ensure_good(tb2, good_tree, good_id)
    up = d.deploy(tb2, good_tree, d.DeployOptions())
    if up.verdict != "UP-TO-DATE":  # ensure_good may have left a rollback's record without an invocation
        assert up.verdict == "PASS", up.line()
        assert d.deploy(tb2, good_tree, d.DeployOptions()).verdict == "UP-TO-DATE"
    gated, _ = state(tb2)
    sh(tb2, f"systemctl kill -s KILL {tb2.unit}.service")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        snap, _ = state(tb2)
        if snap.unit.active_state == "active" and snap.unit.invocation_id not in ("", gated.unit.invocation_id):
            break
        time.sleep(0.2)
    assert snap.unit.invocation_id != gated.unit.invocation_id, snap.unit
    res = d.deploy(tb2, good_tree, d.DeployOptions())
    assert res.verdict == "PASS", res.line()  # deployed again and gated, not UP-TO-DATE
    assert res.step_times.get("gate") is not None
    assert res.plan is not None and any("never gated" in n for n in res.plan.notes), res.plan.notes
    snap, history = state(tb2)
    assert history[-1].invocation == snap.unit.invocation_id
    assert d.deploy(tb2, good_tree, d.DeployOptions()).verdict == "UP-TO-DATE"


# ------------------------------------------------------------------------------------------------ item 8


def test_unproven_first_deploy_leaves_nothing_a_reboot_starts(
    testbed_handle: Testbed, local: HostConfig, good_tree: Path, good_id: str
) -> None:
    """No earlier release, a deploy that ends UNPROVEN (the probe disabled, no traffic): the unit is stopped and
    disabled, `current` is gone, and after a power cut and a boot the unit is still not running."""
    reset_host(local)
    res = d.deploy(without_probe(local), good_tree, d.DeployOptions(gate_timeout_s=4, skip_prerestart_parity=True))
    assert res.verdict == "UNPROVEN", res.line()
    assert res.rolled_back_to is None and "unit stopped and disabled" in res.line()
    snap, history = state(local)
    assert snap.current is None and good_id in snap.releases and good_id not in snap.bad
    assert snap.unit.active_state != "active"
    assert sh(local, f"systemctl is-enabled {local.unit}.service") == "disabled"
    assert history[-1].verdict == "UNPROVEN" and history[-1].current is None
    testbed_handle.poweroff("local")
    testbed_handle.boot("local")
    time.sleep(3)  # the stand-in would be active within about 3 s of a start
    snap, _ = state(local)
    assert snap.unit.active_state not in ("active", "activating"), snap.unit
    # The next deploy installs, enables and gates it.
    again = d.deploy(local, good_tree, d.DeployOptions(skip_prerestart_parity=True))
    assert again.verdict == "PASS", again.line()
    assert sh(local, f"systemctl is-enabled {local.unit}.service") == "enabled"
