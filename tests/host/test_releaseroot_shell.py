"""hoststate's shell snippets run for real in a local shell against a temp release root."""

import os
from dataclasses import replace
from pathlib import Path

import pytest

from opsctl.errors import CommandFailed, DeployFailed, LockHeld
from opsctl.host import history as host_history
from opsctl.host import releaseroot
from opsctl.lock import hostlock
from tests.pipeline.localremote import LocalRemote

A, B = "r00000000000a", "r00000000000b"


@pytest.fixture
def root(tmp_path: Path) -> releaseroot.Layout:
    return releaseroot.Layout(str(tmp_path / "kdtree-engine"))


def test_layout_snapshot_switch_history(root: releaseroot.Layout) -> None:
    r = LocalRemote()
    snap = releaseroot.read_snapshot(r, root.root, "nonexistent-unit-xyz")
    assert snap.is_virgin and not snap.is_managed and snap.free_mb and snap.boot_id
    releaseroot.ensure_layout(r, root, adopted=False)
    for rid in (A, B):
        os.makedirs(root.release(rid))
    releaseroot.switch_current(r, root, A)
    releaseroot.switch_current(r, root, B)
    assert os.readlink(root.current) == f"releases/{B}"
    assert not [p for p in os.listdir(root.root) if p.startswith(".current.tmp")]
    releaseroot.mark_bad(r, root, A, "gate FAIL")
    releaseroot.set_last_good(r, root, B)
    quoted = 'it\'s "quoted" $HOME `x`'
    record = host_history.HistoryRecord(host_history.HistoryEvent.DEPLOY, B, host_history.DeployVerdict.PASS, quoted)
    host_history.append_history(r, root, record)
    snap = releaseroot.read_snapshot(r, root.root, "nonexistent-unit-xyz")
    assert snap.is_managed and snap.current == B and snap.bad == {A} and snap.last_good == B
    assert set(snap.releases) == {A, B}
    hist = host_history.read_history(r, root)
    assert hist[-1].reason == quoted and hist[-1].at and hist[-1] == replace(record, at=hist[-1].at)


def test_switch_to_missing_release_fails(root: releaseroot.Layout) -> None:
    r = LocalRemote()
    releaseroot.ensure_layout(r, root, adopted=False)
    with pytest.raises(CommandFailed):
        releaseroot.switch_current(r, root, A)
    assert not os.path.lexists(root.current)


def test_lock_held_names_owner_and_release(root: releaseroot.Layout) -> None:
    r = LocalRemote()
    first = hostlock.LockOwner.mine("deploy r00000000000a")
    assert hostlock.acquire_lock(r, root, first, "tb1") is None
    second = hostlock.LockOwner.mine("deploy r00000000000b")
    with pytest.raises(LockHeld) as e:
        hostlock.acquire_lock(r, root, second, "tb1")
    assert f"pid {first.pid}" in e.value.message and "deploy r00000000000a" in e.value.message
    assert not hostlock.release_lock(r, root, second)  # not ours: left alone
    assert os.path.isdir(root.lock)
    assert hostlock.release_lock(r, root, first)
    assert not os.path.exists(root.lock)


def test_stale_lock_from_earlier_boot_is_taken_over(root: releaseroot.Layout) -> None:
    r = LocalRemote()
    old = hostlock.LockOwner.mine("deploy old")
    hostlock.acquire_lock(r, root, old, "tb1")
    Path(root.lock, "boot_id").write_text("00000000-0000-0000-0000-000000000000\n")
    snap = releaseroot.read_snapshot(r, root.root, "nonexistent-unit-xyz")
    assert snap.lock_present and snap.lock_stale
    new = hostlock.LockOwner.mine("deploy new")
    stale = hostlock.acquire_lock(r, root, new, "tb1")
    assert stale and "deploy old" in stale
    assert new.token in Path(root.lock, "owner.json").read_text()


def test_remove_releases_only_under_root(root: releaseroot.Layout) -> None:
    r = LocalRemote()
    os.makedirs(root.release(A))
    releaseroot.remove_releases(r, root, [A])
    assert not os.path.exists(root.release(A))
    with pytest.raises(DeployFailed):
        releaseroot.remove_releases(r, root, ["../../etc"])


def _lease(root: releaseroot.Layout) -> float:
    return float(Path(root.lock, "lease").read_text())


def test_lock_is_a_lease_shown_by_the_snapshot(root: releaseroot.Layout) -> None:
    r = LocalRemote()
    owner = hostlock.LockOwner.mine("deploy r00000000000a")
    assert hostlock.acquire_lock(r, root, owner, "tb1", lease_s=120) is None
    snap = releaseroot.read_snapshot(r, root.root, "nonexistent-unit-xyz")
    assert snap.lock_present and not snap.lock_stale
    assert snap.lock_remaining_s is not None and 110 <= snap.lock_remaining_s <= 120
    before = _lease(root)
    Path(root.lock, "lease").write_text(f"{int(before) - 100}\n")
    assert hostlock.renew_lock(r, root, owner, lease_s=300)
    assert _lease(root) >= before + 170
    other = hostlock.LockOwner.mine("deploy r00000000000b")
    assert not hostlock.renew_lock(r, root, other)  # only the holder renews


def test_a_retry_after_a_lost_reply_finds_its_own_lock(root: releaseroot.Layout) -> None:
    """The reply to the remote mkdir was lost: retrying the same acquire must succeed, not report it held."""
    r = LocalRemote()
    owner = hostlock.LockOwner.mine("deploy r00000000000a")
    assert hostlock.acquire_lock(r, root, owner, "tb1") is None
    assert hostlock.acquire_lock(r, root, owner, "tb1") is None  # the retry
    assert hostlock.release_lock(r, root, owner) and not os.path.exists(root.lock)


def test_an_expired_lease_is_taken_over_naming_the_old_owner(root: releaseroot.Layout) -> None:
    r = LocalRemote()
    old = hostlock.LockOwner.mine("deploy r00000000000a")
    hostlock.acquire_lock(r, root, old, "tb1", lease_s=120)
    new = hostlock.LockOwner.mine("deploy r00000000000b")
    with pytest.raises(LockHeld, match=r"lease 1[012]\ds left"):
        hostlock.acquire_lock(r, root, new, "tb1")
    Path(root.lock, "lease").write_text(f"{int(_lease(root)) - 130}\n")  # its holder stopped renewing 10 s ago
    assert releaseroot.read_snapshot(r, root.root, "nonexistent-unit-xyz").lock_stale
    taken = hostlock.acquire_lock(r, root, new, "tb1")
    assert taken is not None and "deploy r00000000000a" in taken and "lease ran out" in taken
    assert new.token in Path(root.lock, "owner.json").read_text()
    assert not hostlock.release_lock(r, root, old)  # the old run, if it comes back, cannot free the new lock
    assert hostlock.release_lock(r, root, new)


def test_a_lock_without_a_lease_file_expires_a_minute_after_it_was_made(root: releaseroot.Layout) -> None:
    r = LocalRemote()
    releaseroot.ensure_layout(r, root, adopted=False)
    os.makedirs(root.lock)  # its taker died between mkdir and writing anything
    new = hostlock.LockOwner.mine("deploy r00000000000b")
    with pytest.raises(LockHeld):
        hostlock.acquire_lock(r, root, new, "tb1")
    old = os.stat(root.lock).st_mtime - 3600
    os.utime(root.lock, (old, old))
    assert hostlock.acquire_lock(r, root, new, "tb1") is not None
