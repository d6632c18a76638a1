"""hoststate's shell snippets run for real in a local shell against a temp release root."""

import os
from pathlib import Path

import pytest

from opsctl import hoststate as hs
from opsctl.errors import CommandFailed, DeployFailed, LockHeld

from .localremote import LocalRemote

A, B = "r00000000000a", "r00000000000b"


@pytest.fixture
def root(tmp_path: Path) -> hs.Layout:
    return hs.Layout(str(tmp_path / "kdtree-engine"))


def test_layout_snapshot_switch_history(root: hs.Layout) -> None:
    r = LocalRemote()
    snap = hs.read_snapshot(r, root.root, "nonexistent-unit-xyz")
    assert snap.is_virgin and not snap.is_managed and snap.free_mb and snap.boot_id
    hs.ensure_layout(r, root, adopted=False)
    for rid in (A, B):
        os.makedirs(root.release(rid))
    hs.switch_current(r, root, A)
    hs.switch_current(r, root, B)
    assert os.readlink(root.current) == f"releases/{B}"
    assert not [p for p in os.listdir(root.root) if p.startswith(".current.tmp")]
    hs.mark_bad(r, root, A, "gate FAIL")
    hs.set_last_good(r, root, B)
    hs.append_history(r, root, {"event": "deploy", "release": B, "verdict": "PASS", "note": 'it\'s "quoted" $HOME `x`'})
    snap = hs.read_snapshot(r, root.root, "nonexistent-unit-xyz")
    assert snap.is_managed and snap.current == B and snap.bad == {A} and snap.last_good == B
    assert set(snap.releases) == {A, B}
    hist = hs.read_history(r, root)
    assert hist[-1]["note"] == 'it\'s "quoted" $HOME `x`' and hist[-1]["at"]


def test_switch_to_missing_release_fails(root: hs.Layout) -> None:
    r = LocalRemote()
    hs.ensure_layout(r, root, adopted=False)
    with pytest.raises(CommandFailed):
        hs.switch_current(r, root, A)
    assert not os.path.lexists(root.current)


def test_lock_held_names_owner_and_release(root: hs.Layout) -> None:
    r = LocalRemote()
    first = hs.LockOwner.mine("deploy r00000000000a")
    assert hs.acquire_lock(r, root, first, "tb1") is None
    second = hs.LockOwner.mine("deploy r00000000000b")
    with pytest.raises(LockHeld) as e:
        hs.acquire_lock(r, root, second, "tb1")
    assert f"pid {first.pid}" in e.value.message and "deploy r00000000000a" in e.value.message
    assert not hs.release_lock(r, root, second)  # not ours: left alone
    assert os.path.isdir(root.lock)
    assert hs.release_lock(r, root, first)
    assert not os.path.exists(root.lock)


def test_stale_lock_from_earlier_boot_is_taken_over(root: hs.Layout) -> None:
    r = LocalRemote()
    old = hs.LockOwner.mine("deploy old")
    hs.acquire_lock(r, root, old, "tb1")
    Path(root.lock, "boot_id").write_text("00000000-0000-0000-0000-000000000000\n")
    snap = hs.read_snapshot(r, root.root, "nonexistent-unit-xyz")
    assert snap.lock_present and snap.lock_stale
    new = hs.LockOwner.mine("deploy new")
    stale = hs.acquire_lock(r, root, new, "tb1")
    assert stale and "deploy old" in stale
    assert new.token in Path(root.lock, "owner.json").read_text()


def test_remove_releases_only_under_root(root: hs.Layout) -> None:
    r = LocalRemote()
    os.makedirs(root.release(A))
    hs.remove_releases(r, root, [A])
    assert not os.path.exists(root.release(A))
    with pytest.raises(DeployFailed):
        hs.remove_releases(r, root, ["../../etc"])
