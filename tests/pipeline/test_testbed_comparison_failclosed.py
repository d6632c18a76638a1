"""The comparison fails closed on real testbed hosts (issue 47): a slow release measured while other work takes the
host's CPU is never passed as "cannot decide", and a baseline the running release refuses (a wrong API key) stops
the deploy before the switch, as a configuration error."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from opsctl import pipeline as d
from opsctl.errors import DeployFailed
from opsctl.inventory import HostConfig, Inventory
from opsctl.release import make_manifest
from opsctl.ssh import connect
from opsctl.testbed import reset_host, variants
from tests.builders import comparing_at_1_and_8
from tests.pipeline import trees
from tests.pipeline.test_testbed_deploy import Recorder, ensure_good, fast, state

# They judge decode speed on the testbed: .ci/run runs them last, one at a time, on an otherwise idle machine
# (beside two other workers on 2 cores a 1.5x slower release was once measured within the pairs' noise).
pytestmark = pytest.mark.quiet

HOST = "tb2"
ENV_FILE = "/etc/kdtree-engine/sglang-failclosed.env"
KEY = "sk-testbed-compare-4d1e8a"


@pytest.fixture
def tb2(testbed: Inventory) -> HostConfig:
    """tb2 with the pipeline tests' short gate, the comparison on (as the inventory has it)."""
    return comparing_at_1_and_8(fast(testbed.host(HOST)))


# Two busy loops, and a watcher that moves them into the cgroup of each `python3 -` (the workload's host program:
# its calibration runs there) as it starts. systemd shares the CPU between cgroups first, so loops of their own
# would slow the service and leave the calibration as it was; beside the program they slow its calibration and
# leave the service's share: other work on the host that a busier calibration shows, while the server is no slower.
_BUSY = "nohup timeout {s} sh -c 'while :; do :; done' >/dev/null 2>&1 </dev/null & hogs=\"$hogs $!\""
_FOLLOW = (
    'nohup timeout {s} sh -c \'while :; do for p in $(pgrep -f "^python3 -$"); do '
    'cg=$(sed -n "s/^0:://p" /proc/$p/cgroup); for h in $0; do echo $h > /sys/fs/cgroup$cg/cgroup.procs; done; '
    'done 2>/dev/null; sleep 0.2; done\' "$hogs" >/dev/null 2>&1 </dev/null & echo $hogs $!'
)


def load_cpu(host: HostConfig, procs: int = 2, max_s: int = 180) -> list[str]:
    """Other work beside the workload's host program on ``host`` (each process ended after ``max_s`` whatever
    happens) -> the pids, for :func:`unload_cpu`."""
    script = "hogs=''; " + "; ".join([_BUSY.format(s=max_s)] * procs) + "; " + _FOLLOW.format(s=max_s)
    with connect(host) as r:
        return r.run(script, timeout=30).stdout.split()


def unload_cpu(host: HostConfig, pids: list[str]) -> None:
    if pids:
        with connect(host) as r:
            r.run(f"kill {' '.join(pids)} 2>/dev/null; true", timeout=30, check=False)


def test_a_slow_release_measured_on_a_busier_host_is_never_passed(
    tb2: HostConfig, good_tree: Path, good_id: str, tmp_path: Path
) -> None:
    # Issue 47: decode 0.63x with the host's calibration 1.16x apart (bound 1.15x) was withheld as "cannot decide",
    # and the slow release became current. Here two busy loops take the host's CPU from the moment the comparison
    # step starts: the baseline was measured on a quiet host, every sample of the new release on a busy one. They
    # are started over SSH, so they share the CPU with the workload's host program and its calibration (the
    # testbed's SSH sessions run in ssh.service's cgroup); in a cgroup of their own, beside the service, they slow
    # the server and leave the calibration as it was: a plain FAIL, not this case.
    ensure_good(tb2, good_tree, good_id)
    slow = variants.slow(trees.SOURCE, tmp_path / "slow")
    slow_id = make_manifest(slow).id
    rec = Recorder()
    hogs: list[str] = []
    rec.on_step["comparison"] = lambda: hogs.extend(load_cpu(tb2))
    try:
        res = d.deploy(tb2, slow, d.DeployOptions(force=True), reporter=rec)  # marked bad by an earlier run
    finally:
        unload_cpu(tb2, hogs)
    c = res.comparison or {}
    result = c.get("result") or {}
    print(f"\n[measure] slow release on a busier host: {res.verdict}: {c.get('line')}; load {result.get('load')}")
    # Whether the calibration differed beyond its bound depends on how the kernel shares this 2-core machine with
    # other work too (measured: 0.89x to 1.13x apart with these loops); the judge's tests pin the figures
    # (tests/comparison/test_compare.py). Whatever it was, a slow release is never passed.
    assert res.verdict in ("FAIL", "UNPROVEN") and res.stage == "comparison", (res.line(), c.get("line"))
    assert res.rolled_back_to == good_id and res.rollback_verdict == "PASS"
    snap, _ = state(tb2)
    assert snap.current == good_id and snap.unit.active_state == "active"
    if res.verdict == "FAIL":  # the contention could not explain the slowdown: a verdict on the release
        assert slow_id in snap.bad and res.reason.startswith("comparison: decode 0.")
        # Busier on the new side, and the FAIL stands: the level's reason says the contention cannot explain it.
        # (Busier on the old side, it could only have hidden a slowdown: nothing to explain.) Per level: the host
        # may differ at one level (withheld there) and not at the one that FAILed.
        for level in result.get("levels") or []:
            adjusted, ratio = level.get("adjusted_ratio"), level.get("ratio")
            if level["outcome"] == "FAIL" and adjusted is not None and ratio is not None and adjusted > ratio:
                assert "cannot explain the slowdown" in (level.get("note") or ""), level
    else:  # withheld on every sample: not proven, rolled back, not marked bad (exit 32)
        assert slow_id not in snap.bad and c["outcome"] == "UNPROVEN" and c.get("candidate_samples") == 3
        assert "not proven, never a PASS" in res.reason


@pytest.fixture
def keyed(tb2: HostConfig) -> Iterator[HostConfig]:
    """tb2 whose service requires ``KEY`` (in ``ENV_FILE``), which also holds a wrong key under another name."""
    with connect(tb2) as r:
        r.run(f"mkdir -p {os.path.dirname(ENV_FILE)}", timeout=30)
        r.write_file(ENV_FILE, f"SGLANG_API_KEY={KEY}\nWRONG_KEY=sk-not-the-key\n".encode(), mode=0o600)
    svc = tb2.service.model_copy(update={"environment_file": ENV_FILE})
    host = tb2.model_copy(update={"service": svc})
    yield host
    reset_host(host)  # the next test's service must not run with this key
    with connect(tb2) as r:
        r.run(f"rm -f {ENV_FILE}", timeout=30)


def test_a_baseline_refused_by_the_running_release_stops_before_the_switch(
    keyed: HostConfig, good_tree: Path, good_id: str, tmp_path: Path
) -> None:
    reset_host(keyed)
    first = d.deploy(keyed, good_tree, d.DeployOptions())
    assert first.verdict == "PASS", first.line()
    before, _ = state(keyed)
    assert before.current == good_id and before.unit.active_state == "active" and before.unit.invocation_id
    # opsctl sends the wrong key: the running release answers 401 to the whole workload.
    probe = keyed.gate.probe.model_copy(update={"api_key_env": "WRONG_KEY"})
    wrong = keyed.model_copy(update={"gate": keyed.gate.model_copy(update={"probe": probe})})
    other = trees.copy_tree(tmp_path / "other", "other")
    rec = Recorder()
    with pytest.raises(DeployFailed) as raised:
        d.deploy(wrong, other, d.DeployOptions(), reporter=rec)
    assert raised.value.exit_code == 30
    message = raised.value.message
    assert "refused every request of the comparison workload (HTTP 401)" in message, message
    assert "before the switch" in message and KEY not in message
    assert "restart" not in rec.steps and "switch" not in rec.steps, rec.steps
    after, history_after = state(keyed)
    # Nothing switched or restarted, nothing marked bad.
    assert after.current == good_id and after.unit.active_state == "active"
    assert after.unit.invocation_id == before.unit.invocation_id
    assert not after.bad and after.last_good == good_id
    last = history_after[-1]
    assert last.verdict == "ERROR" and last.release == make_manifest(other).id and last.current == good_id
    assert last.comparison is not None and last.comparison["outcome"] == "ERROR"
