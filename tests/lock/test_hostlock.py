"""The lock's commands as text, and run in a local shell against a temp state directory."""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path

import pytest

from opsctl.hostdata.layout import Layout
from opsctl.lock.hostlock import (
    LOCK_LEASE_S,
    LockOwner,
    acquire_command,
    acquire_lock,
    lease_expiry_expr,
    lock_input,
    release_command,
    release_lock,
    renew_command,
    renew_lock,
)
from tests.pipeline.localremote import LocalRemote
from tests.shell import HOSTILE, sh


def owner(token: str) -> str:
    return json.dumps({"token": token, "user": "it's me", "pid": 1})


def acquire(state: str, lock: str, token: str, lease_s: float = 120) -> str:
    return sh(acquire_command(state, lock, lease_s), stdin=lock_input(token, owner(token))).stdout


def renew(lock: str, token: str) -> str:
    return sh(renew_command(lock, 120), stdin=lock_input(token)).stdout


def release(lock: str, token: str) -> str:
    return sh(release_command(lock), stdin=lock_input(token)).stdout


def test_every_value_is_quoted() -> None:
    lock = f"{HOSTILE}/state/lock"
    cmd = acquire_command(f"{HOSTILE}/state", lock, LOCK_LEASE_S)
    assert shlex.quote(lock) in cmd and f"+ {int(LOCK_LEASE_S)} ))" in cmd
    renewal = renew_command(lock, 30)
    assert shlex.quote(f"{lock}/owner.json") in renewal and shlex.quote(f"{lock}/lease") in renewal
    assert release_command(lock, forced=True) == f"rm -rf -- {shlex.quote(lock)}"
    assert "RELEASED" in release_command(lock)


def test_the_owners_nonce_never_is_in_a_command_line(tmp_path: Path) -> None:
    """Issue 36 item 10: `_owns` put the nonce in argv (`sh -c ...` on the host), where `ps` shows it to every
    user; so did the owner record written by acquire. They travel on stdin now."""
    remote, layout = LocalRemote(), Layout(str(tmp_path / "root"))
    me = LockOwner.mine("deploy r1")
    assert acquire_lock(remote, layout, me, "h1") is None
    assert json.loads((tmp_path / "root/state/lock/owner.json").read_text())["token"] == me.token
    assert renew_lock(remote, layout, me) and release_lock(remote, layout, me)
    assert len(remote.commands) == 3 and not any(me.token in c for c in remote.commands)
    assert not (tmp_path / "root/state/lock").exists()


def test_an_empty_or_missing_token_owns_nothing(tmp_path: Path) -> None:
    state, lock = str(tmp_path / "state"), str(tmp_path / "state" / "lock")
    assert acquire(state, lock, "first").strip() == "ACQUIRED"
    assert sh(renew_command(lock, 120), stdin="").stdout == "" and sh(release_command(lock)).stdout == ""
    assert renew(lock, "").strip() == "" and os.path.isdir(lock)
    with pytest.raises(ValueError, match="one line"):
        lock_input("a\nb")


def test_acquire_held_renew_release_in_a_shell(tmp_path: Path) -> None:
    state, lock = str(tmp_path / "state"), str(tmp_path / "state" / "lock")
    assert acquire(state, lock, "first").strip() == "ACQUIRED"
    assert json.loads((tmp_path / "state/lock/owner.json").read_text())["token"] == "first"
    held = acquire(state, lock, "second")
    word, left = held.splitlines()[0].split()
    assert word == "HELD" and 100 < int(left) <= 120 and '"first"' in held
    again = acquire(state, lock, "first")  # a retry after a lost reply
    assert again.strip() == "ACQUIRED"
    assert renew(lock, "second") == ""  # not its lock
    assert renew(lock, "first").strip() == "RENEWED"
    assert release(lock, "second") == "" and os.path.isdir(lock)
    assert release(lock, "first").strip() == "RELEASED" and not os.path.exists(lock)


def test_expired_lease_is_taken_over(tmp_path: Path) -> None:
    state, lock = str(tmp_path / "state"), str(tmp_path / "state" / "lock")
    acquire(state, lock, "old")
    (tmp_path / "state/lock/lease").write_text("1\n")  # ran out long ago
    out = acquire(state, lock, "new").splitlines()
    assert out[0].startswith("EXPIRED ") and '"old"' in out[1] and out[-1] == "ACQUIRED"
    assert json.loads((tmp_path / "state/lock/owner.json").read_text())["token"] == "new"


def test_unleased_lock_expires_after_the_directory_mtime(tmp_path: Path) -> None:
    lock = tmp_path / "lock"
    lock.mkdir()
    os.utime(lock, (1000, 1000))
    assert sh(lease_expiry_expr(str(lock))).stdout.strip() == "1060"
    (lock / "lease").write_text("5\n")
    assert sh(lease_expiry_expr(str(lock))).stdout.strip() == "5"
