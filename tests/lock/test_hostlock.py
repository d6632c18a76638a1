"""The lock's commands as text, and run in a local shell against a temp state directory."""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path

from opsctl.lock.hostlock import LOCK_LEASE_S, acquire_command, lease_expiry_expr, release_command, renew_command
from tests.shell import HOSTILE, sh


def owner(token: str) -> str:
    return json.dumps({"token": token, "user": "it's me", "pid": 1})


def test_every_value_is_quoted() -> None:
    lock = f"{HOSTILE}/state/lock"
    cmd = acquire_command(f"{HOSTILE}/state", lock, owner("t0k3n$x"), "t0k3n$x", LOCK_LEASE_S)
    assert shlex.quote(lock) in cmd and shlex.quote("t0k3n$x") in cmd and shlex.quote(owner("t0k3n$x")) in cmd
    assert f"+ {int(LOCK_LEASE_S)} ))" in cmd
    renew = renew_command(lock, "tok", 30)
    assert shlex.quote(f"{lock}/owner.json") in renew and shlex.quote(f"{lock}/lease") in renew
    assert release_command(lock, None) == f"rm -rf -- {shlex.quote(lock)}"
    assert "RELEASED" in release_command(lock, "tok") and "grep -qF tok" in release_command(lock, "tok")


def test_acquire_held_renew_release_in_a_shell(tmp_path: Path) -> None:
    state, lock = str(tmp_path / "state"), str(tmp_path / "state" / "lock")
    assert sh(acquire_command(state, lock, owner("first"), "first", 120)).stdout.strip() == "ACQUIRED"
    assert json.loads((tmp_path / "state/lock/owner.json").read_text())["token"] == "first"
    held = sh(acquire_command(state, lock, owner("second"), "second", 120)).stdout
    word, left = held.splitlines()[0].split()
    assert word == "HELD" and 100 < int(left) <= 120 and '"first"' in held
    again = sh(acquire_command(state, lock, owner("first"), "first", 120)).stdout  # a retry after a lost reply
    assert again.strip() == "ACQUIRED"
    assert sh(renew_command(lock, "second", 120)).stdout == ""  # not its lock
    assert sh(renew_command(lock, "first", 120)).stdout.strip() == "RENEWED"
    assert sh(release_command(lock, "second")).stdout == "" and os.path.isdir(lock)
    assert sh(release_command(lock, "first")).stdout.strip() == "RELEASED" and not os.path.exists(lock)


def test_expired_lease_is_taken_over(tmp_path: Path) -> None:
    state, lock = str(tmp_path / "state"), str(tmp_path / "state" / "lock")
    sh(acquire_command(state, lock, owner("old"), "old", 120))
    (tmp_path / "state/lock/lease").write_text("1\n")  # ran out long ago
    out = sh(acquire_command(state, lock, owner("new"), "new", 120)).stdout.splitlines()
    assert out[0].startswith("EXPIRED ") and '"old"' in out[1] and out[-1] == "ACQUIRED"
    assert json.loads((tmp_path / "state/lock/owner.json").read_text())["token"] == "new"


def test_unleased_lock_expires_after_the_directory_mtime(tmp_path: Path) -> None:
    lock = tmp_path / "lock"
    lock.mkdir()
    os.utime(lock, (1000, 1000))
    assert sh(lease_expiry_expr(str(lock))).stdout.strip() == "1060"
    (lock / "lease").write_text("5\n")
    assert sh(lease_expiry_expr(str(lock))).stdout.strip() == "5"
