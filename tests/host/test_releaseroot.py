import json

import pytest

from opsctl.errors import DeployFailed
from opsctl.host.history import HistoryEvent, HistoryRecord, parse_history
from opsctl.host.releaseroot import parse_snapshot, select_for_removal, snapshot_command
from opsctl.hostdata.layout import Layout
from opsctl.lock.hostlock import describe_owner

SNAP = """root_exists=1
managed={"since": "2026-01-01T00:00:00Z", "adopted": false}
current=releases/r00000000000b
release=100 r00000000000a
release=200 r00000000000b
release=300 r00000000000c
release=50 r0-00000000000f
release=10 not-a-release
bad=r00000000000c
last_good=r00000000000b
lock_present=1
lock={"user": "ops", "client": "laptop", "pid": 42, "since": "t", "command": "deploy r00000000000c", "token": "x"}
entry=releases
entry=state
entry=current
entry=sglang_ext
disk_avail_kb=12641280
unit.LoadState=loaded
unit.ActiveState=active
unit.SubState=running
unit.FragmentPath=/etc/systemd/system/sglang-k26-ddtree.service
unit.NRestarts=2
unit.InvocationID=abc
unit.Result=success
unit.DropInPaths=
gpu_rc=0
gpu=NVIDIA RTX PRO 6000 Blackwell Server Edition, 12.0
gpu=NVIDIA RTX PRO 6000 Blackwell Server Edition, 12.0
now=1700000000
"""


def test_parse_snapshot() -> None:
    s = parse_snapshot(SNAP)
    assert s.root_exists and s.is_managed and not s.is_virgin
    assert s.current == "r00000000000b"
    assert s.releases == {"r00000000000a": 100, "r00000000000b": 200, "r00000000000c": 300, "r0-00000000000f": 50}
    assert s.bad == {"r00000000000c"} and s.last_good == "r00000000000b"
    assert s.lock_present and s.lock_owner and s.lock_owner["user"] == "ops"
    assert "ops@laptop pid 42" in describe_owner(s.lock_owner)
    assert s.free_mb == 12345 and s.gpu_compute_caps == ("12.0",)
    assert s.unit.exists and s.unit.n_restarts == 2 and s.unit.invocation_id == "abc"
    assert s.other_root_entries == ("sglang_ext",)


def test_parse_virgin_snapshot() -> None:
    s = parse_snapshot(
        "root_exists=0\nmanaged=\ncurrent=\nlast_good=\ndisk_avail_kb=921600\nunit.LoadState=not-found\nnow=1\n"
    )
    assert s.is_virgin and not s.is_managed and s.current is None and not s.lock_present
    assert describe_owner(None).startswith("an unknown owner")


def test_snapshot_command_quotes() -> None:
    cmd = snapshot_command("/srv/kdtree engine", "u")
    assert "R='/srv/kdtree engine'" in cmd


def test_select_for_removal_keeps_protected_and_newest() -> None:
    rel = {f"r{i:012x}": float(i) for i in range(1, 9)}
    rel["r0-00000000000f"] = 0.0
    doomed = select_for_removal(rel, keep=3, protected=["r000000000001", None])
    # keep 3: the three newest (8, 7, 6), besides them the protected r1 and release zero (issue 38).
    assert "r000000000001" not in doomed and "r0-00000000000f" not in doomed
    assert not {"r000000000008", "r000000000007", "r000000000006"} & set(doomed)
    assert doomed == sorted(doomed, key=lambda r: rel[r])  # oldest first
    assert doomed == ["r000000000002", "r000000000003", "r000000000004", "r000000000005"]


def test_select_for_removal_nothing_when_few() -> None:
    assert select_for_removal({"r000000000001": 1.0, "r000000000002": 2.0}, keep=5, protected=[]) == []


def test_layout_refuses_bad_ids() -> None:
    lay = Layout("/srv/k")
    assert lay.release("r0123456789ab") == "/srv/k/releases/r0123456789ab"
    for bad in ["../etc", "r0123456789ab/..", "", "/", "r0123"]:
        with pytest.raises(DeployFailed):
            lay.release(bad)


def test_parse_history_skips_torn_lines() -> None:
    text = json.dumps({"event": "deploy", "release": "r1"}) + "\n" + '{"event": "dep'
    assert parse_history(text) == [HistoryRecord(HistoryEvent.DEPLOY, "r1")]


def test_lock_lease_as_opsctl_lock_shows_it() -> None:
    from opsctl.cli.lock import lease_text

    base = parse_snapshot("lock_present=1\nlock_boot=b1\nboot_id=b1\nnow=1000\nlock_lease=1090\n")
    assert base.lock_remaining_s == 90 and not base.lock_stale
    assert lease_text(base) == ", lease 90s left (renewed while its holder runs)"
    expired = parse_snapshot("lock_present=1\nlock_boot=b1\nboot_id=b1\nnow=1000\nlock_lease=970\n")
    assert expired.lock_stale and "lease expired 30s ago" in lease_text(expired)
    rebooted = parse_snapshot("lock_present=1\nlock_boot=b0\nboot_id=b1\nnow=1000\nlock_lease=1090\n")
    assert rebooted.lock_stale and "before the host last booted" in lease_text(rebooted)


def test_history_lines_read_back_typed_and_write_the_same_bytes() -> None:
    """A history file written before the records were typed reads into HistoryRecords, and each record writes its
    line back byte for byte (json.dumps with sorted keys, as append_history writes it)."""
    from opsctl.gate.decision import Verdict
    from opsctl.host.history import DeployVerdict

    old = [
        '{"at": "2026-06-01T10:00:00Z", "by": "ops@laptop", "event": "deploy-start", "previous": "r00000000000a", '
        '"release": "r00000000000b"}',
        '{"at": "2026-06-01T10:05:00Z", "current": "r00000000000a", "event": "deploy", "gate": {"lines": 3, '
        '"verdict": "FAIL", "worst": {"rel": "nan"}}, "previous": "r00000000000a", "reason": "gate FAIL: nan", '
        '"release": "r00000000000b", "verdict": "FAIL"}',
        '{"at": "2026-06-01T10:06:00Z", "automatic": true, "event": "rollback", "from": "r00000000000b", '
        '"release": "r00000000000a", "verdict": "PASS"}',
        '{"at": "2026-06-01T10:07:00Z", "event": "lock-break", "owner": {"pid": 7, "user": "ops"}}',
        '{"at": "2026-06-01T10:08:00Z", "dirty": false, "event": "adopt", "files": 12, "release": "r0-00000000000c", '
        '"unit": "/etc/systemd/system/x.service", "verdict": "ADOPTED"}',
    ]
    records = parse_history("\n".join(old))
    assert [json.dumps(r.as_json(), sort_keys=True) for r in records] == old
    assert records[1].verdict is DeployVerdict.FAIL and records[2].rolled_back_from == "r00000000000b"
    assert records[3].event is HistoryEvent.LOCK_BREAK and records[3].release is None and records[4].files == 12
    # Not records: a verdict or event this opsctl does not know, JSON that is no object, a torn line. A key it
    # does not know is left out; a value of the wrong type reads as unset.
    skipped = ['{"event": "deploy", "verdict": "MAYBE"}', '{"event": "reboot"}', "[1, 2]", '{"event": "dep']
    odd = parse_history("\n".join([*skipped, '{"event": "deploy", "release": 7, "note": "x", "files": true}']))
    assert odd == [HistoryRecord(HistoryEvent.DEPLOY)]
    assert {DeployVerdict.from_gate(v) for v in Verdict if v is not Verdict.PENDING} == {
        DeployVerdict(v.value) for v in Verdict if v is not Verdict.PENDING
    }
    with pytest.raises(ValueError, match="not decided"):
        DeployVerdict.from_gate(Verdict.PENDING)
