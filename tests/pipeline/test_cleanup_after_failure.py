"""Keep-N means what it says (issue 38): a deploy's cleanup runs after a rejected deploy too, under the lock, once
the host is restored; it keeps current, last good, the release being deployed and the N newest, and records what
it removed in the history (what `opsctl releases` shows). On a real shell and release root (LocalRemote)."""

from __future__ import annotations

import os
import types
from pathlib import Path

from opsctl.host import history as host_history
from opsctl.host import releaseroot
from opsctl.pipeline import DeployVerdict
from opsctl.pipeline.deploy import _cleanup
from opsctl.pipeline.runner import Rejected, Run, Step, execute, lock_step
from tests import builders
from tests.pipeline.localremote import LocalRemote
from tests.pipeline.test_runner import Log, local

OLD = [f"r00000000000{i}" for i in range(1, 8)]  # r1 (oldest) .. r7
NEW = "r00000000000f"


def _root(tmp_path: Path) -> tuple[releaseroot.Layout, LocalRemote]:
    layout = releaseroot.Layout(str(tmp_path / "kdtree-engine"))
    r = LocalRemote()
    releaseroot.ensure_layout(r, layout, adopted=False)
    for i, rid in enumerate([*OLD, NEW], 1):
        os.makedirs(layout.release(rid))
        os.utime(layout.release(rid), (1_000_000 + i, 1_000_000 + i))
    releaseroot.switch_current(r, layout, OLD[3])  # r4 runs
    releaseroot.set_last_good(r, layout, OLD[0])  # r1 passed long ago
    return layout, r


def test_a_rejected_deploy_still_cleans_up_and_says_what_it_removed(tmp_path: Path) -> None:
    host = builders.host("h1", gpu_arch=None, root=str(tmp_path / "kdtree-engine"), keep_releases=2)
    layout, r = _root(tmp_path)

    def snapshot(run: Run) -> None:
        run.snap = releaseroot.read_snapshot(run.r, run.host.root, "nonexistent-unit-xyz")

    def reject(_run: Run) -> None:
        raise Rejected(DeployVerdict.FAIL, "parity L0 TP5 rel=0.5 >= fail threshold 0.05")

    steps = [
        Step("snapshot", snapshot, shown=False),
        lock_step(lambda _run: "deploy test"),
        Step("gate", reject),
        _cleanup(types.SimpleNamespace(id=NEW)),  # type: ignore[arg-type]
    ]
    log = Log()
    with Run.open(host, "deploy", log, local, release=NEW) as run:
        result = execute(run, steps)
    assert result.verdict is DeployVerdict.FAIL
    left = set(os.listdir(layout.releases))
    # keep 2: the two newest (NEW, r7), and besides them current (r4) and last good (r1).
    assert left == {NEW, OLD[6], OLD[3], OLD[0]}, left
    assert any(line.startswith("done cleanup: removed") for line in log.lines), log.lines
    assert not os.path.exists(layout.lock)  # cleaned up under the lock, released after
    history = host_history.read_history(r, layout)
    cleanup = [rec for rec in history if rec.event is host_history.HistoryEvent.CLEANUP]
    assert len(cleanup) == 1 and sorted(cleanup[0].removed or []) == sorted([OLD[1], OLD[2], OLD[4], OLD[5]])
    assert cleanup[0].release == NEW and cleanup[0].at


def test_releases_shows_what_cleanup_removed() -> None:
    from opsctl.cli.releases import removed_releases
    from opsctl.host.history import HistoryEvent, HistoryRecord

    history = [
        HistoryRecord(HistoryEvent.CLEANUP, release="r3", removed=["r1"], at="t1"),
        HistoryRecord(HistoryEvent.CLEANUP, release="r5", removed=["r2", "r4"], at="t2"),
    ]
    gone = removed_releases(history, on_host={"r4", "r5"})  # r4 came back (redeployed): not shown as removed
    assert [(rid, rec.at) for rid, rec in gone] == [("r2", "t2"), ("r1", "t1")]
