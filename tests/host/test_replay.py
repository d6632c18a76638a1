"""The replay service and build commands: run from the release directory, with its code and this run's token."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from opsctl.errors import UsageError
from opsctl.host import replay as hr
from tests.shell import HOSTILE, sh

TOKEN = "0123456789abcdef"


def test_in_release_command_sets_the_release_environment(tmp_path: Path) -> None:
    rel = tmp_path / "rel $x"
    rel.mkdir()
    cmd = hr.in_release_command(
        str(rel) + "/", TOKEN, ["sh", "-c", 'echo "$PWD|$PYTHONPATH|$KDTREE_CONFIG|$KDTREE_PARITY_TOKEN"']
    )
    out = sh(cmd.command, stdin=cmd.stdin).stdout.strip().split("|")
    assert out == [str(rel), f"{rel}/kernel:{rel}/backend", f"{rel}/deploy/kdtree.json", TOKEN]


def test_the_token_travels_on_stdin_never_in_argv(tmp_path: Path) -> None:
    """The replay process gets the token in its environment; no process's command line (what `ps` shows to
    every user) carries it, and neither does the command text a CommandFailed message quotes."""
    cmd = hr.in_release_command(str(tmp_path), TOKEN, ["sh", "-c", 'ps -eo args; echo "env=$KDTREE_PARITY_TOKEN"'])
    assert TOKEN not in cmd.command and TOKEN not in repr(cmd)
    res = sh(cmd.command, stdin=cmd.stdin)
    *ps, env = res.stdout.strip().splitlines()
    assert env == f"env={TOKEN}"
    assert any("ps -eo args" in line for line in ps) and not any(TOKEN in line for line in ps), ps
    assert cmd.redact(f"L0 rel=0 token={TOKEN}") == "L0 rel=0 token=<token>"


def test_token_is_checked() -> None:
    for bad in ("short", "x y z 1234567", "a" * 129, "$(id)abcdefgh"):
        with pytest.raises(UsageError):
            hr.in_release_command("/r", bad, ["true"])


def test_synthetic_and_capture_replay() -> None:
    syn = shlex.split(hr.synthetic_replay_command("/usr/bin/python3", HOSTILE, TOKEN, steps=4, threshold=0.02).command)
    assert syn[syn.index("-m") :] == [
        "-m",
        "kdtree_backend.replay",
        "--steps",
        "4",
        "--interval",
        "0",
        "--threshold",
        "0.02",
    ]
    assert syn[:2] == ["cd", HOSTILE]
    cap = shlex.split(hr.capture_replay_command("py", "/r", f"{HOSTILE}/state/capture", TOKEN, threshold=0.05).command)
    assert cap[-4:] == ["--captures", f"{HOSTILE}/state/capture", "--threshold", "0.05"]


def test_build_argv() -> None:
    argv = hr.build_argv("py", "/r/", arch="12.0", out_subdir="ext", timeout_s=1800)
    assert argv == [
        "py",
        "/r/deploy/build_extension.py",
        "--arch",
        "12.0",
        "--out",
        "/r/ext",
        "--log",
        "/r/build.log",
        "--timeout",
        "1800",
    ]


def test_the_capture_presence_check_says_none_only_for_an_absent_or_empty_directory(tmp_path: Path) -> None:
    # The pre-restart check skips the replay process (a torch import: seconds a deploy) only on "none".
    root = tmp_path / HOSTILE.strip("/")
    assert sh(hr.captures_present_command(str(root))).stdout.strip() == hr.NO_CAPTURES  # never captured
    root.mkdir(parents=True)
    assert sh(hr.captures_present_command(str(root))).stdout.strip() == hr.NO_CAPTURES  # pruned to nothing
    (root / "c1").mkdir()
    assert sh(hr.captures_present_command(str(root))).stdout.strip() != hr.NO_CAPTURES
    (root / "c1").rmdir()
    (root / ".partial").write_text("")  # a hidden entry is an entry: the replay judges it
    assert sh(hr.captures_present_command(str(root))).stdout.strip() != hr.NO_CAPTURES
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    assert sh(hr.captures_present_command(str(not_a_dir))).stdout.strip() != hr.NO_CAPTURES  # the replay says why
