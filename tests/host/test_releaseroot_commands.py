"""The release root's commands as text (every value quoted, only release ids deleted) and run in a shell."""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path

import pytest

from opsctl.errors import DeployFailed
from opsctl.host import history as host_history
from opsctl.host import releaseroot as hl
from opsctl.hostdata.facts import facts_command
from tests.shell import HOSTILE, sh

A, B = "r00000000000a", "r00000000000b"


def test_snapshot_command_ends_with_the_facts_probe() -> None:
    cmd = hl.snapshot_command(HOSTILE, "u")
    assert cmd.startswith(f"R={shlex.quote(HOSTILE)}\n")
    assert facts_command(HOSTILE, "u") in cmd and "lock_lease=" in cmd and "boot_id=" in cmd


def test_only_release_ids_are_removed() -> None:
    lay = hl.Layout(HOSTILE)
    assert hl.remove_releases_argv(lay, []) is None
    assert hl.remove_releases_argv(lay, [A]) == ["rm", "-rf", "--", f"{HOSTILE}/releases/{A}"]
    for bad in ("../state", f"{A}/..", "", "*"):
        with pytest.raises(DeployFailed):
            hl.remove_releases_argv(lay, [A, bad])
        with pytest.raises(DeployFailed):
            hl.switch_current_command(lay, bad, ".tmp")


def test_history_line_survives_the_shell(tmp_path: Path) -> None:
    lay = hl.Layout(str(tmp_path / "k e"))
    line = '{"note": "it\'s \\"quoted\\" $HOME `id`"}'
    assert sh(host_history.append_history_command(lay), stdin=f"{line}\n").returncode == 0
    big = json.dumps({"comparison": {"candidate": {"requests": [{"output_ids": list(range(40_000))}]}}})
    assert len(big) > 131_072  # longer than one argument may be (MAX_ARG_STRLEN): it travels on stdin
    assert sh(host_history.append_history_command(lay), stdin=f"{big}\n").returncode == 0
    assert sh(host_history.read_history_command(lay)).stdout == f"{line}\n{big}\n"
    assert sh(host_history.read_history_command(hl.Layout(str(tmp_path / "none")))).returncode == 0


def test_ensure_layout_keeps_an_existing_managed_doc(tmp_path: Path) -> None:
    lay = hl.Layout(str(tmp_path / "root $x"))
    assert sh(hl.ensure_layout_command(lay, '{"first": 1}')).returncode == 0
    assert sh(hl.ensure_layout_command(lay, '{"second": 2}')).returncode == 0
    assert Path(lay.managed).read_text() == '{"first": 1}\n'
    assert all(os.path.isdir(d) for d in (lay.releases, lay.bad, lay.cursors))


def test_switch_current_renames_over_and_refuses_a_missing_release(tmp_path: Path) -> None:
    lay = hl.Layout(str(tmp_path))
    os.makedirs(lay.release(A))
    assert sh(hl.switch_current_command(lay, A, ".current.tmp-1")).returncode == 0
    assert os.readlink(lay.current) == f"releases/{A}"
    assert sh(hl.switch_current_command(lay, B, ".current.tmp-2")).returncode != 0
    assert os.readlink(lay.current) == f"releases/{A}" and not (tmp_path / ".current.tmp-2").exists()


def test_checksums_meta_and_sizes(tmp_path: Path) -> None:
    rel = tmp_path / "releases" / A
    rel.mkdir(parents=True)
    (rel / "f").write_text("x\n")
    (rel / "manifest.json").write_text('{\n "commit": "abc",\n "created_at": "t",\n "dirty": false\n}\n')
    good = "1aa6e7b5ae1d2cf4bbb3d8e8f3c5e0b2c9aa0e7e6cd1c8c5b1e1bd8f1ba3b1d9  f\n"
    assert sh(hl.verify_checksums_command(str(rel)), stdin=good).returncode != 0  # wrong digest
    digest = sh(f"cd {shlex.quote(str(rel))} && sha256sum f").stdout
    assert sh(hl.verify_checksums_command(str(rel)), stdin=digest).returncode == 0
    meta = sh(hl.release_meta_command(hl.Layout(str(tmp_path)))).stdout.splitlines()
    assert meta == [f"== {A}", ' "created_at": "t",', ' "commit": "abc",', ' "dirty": false']
    (tmp_path / "hand made").write_text("y" * 10)
    listing = sh(hl.foreign_files_command(str(tmp_path))).stdout
    assert "./hand made" in listing and "releases" not in listing
    assert sh(hl.size_mb_command(str(tmp_path), ["hand made"])).stdout.split()[-1] == "total"
    assert sh(hl.is_dir_command(str(rel))).returncode == 0 and sh(hl.is_dir_command(str(tmp_path / "x"))).returncode


def test_resolve_current(tmp_path: Path) -> None:
    (tmp_path / "releases" / A).mkdir(parents=True)
    (tmp_path / "current").symlink_to(f"releases/{A}")
    assert sh(hl.resolve_current_command(str(tmp_path))).stdout.strip() == str(tmp_path / "releases" / A)
