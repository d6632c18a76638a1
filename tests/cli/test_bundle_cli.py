"""`opsctl bundle` through the real CLI app: the id and files a deploy of a tree would ship, computed without a
host (the inventory is not even read)."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from opsctl.cli import app
from opsctl.release import make_manifest
from tests.core.test_release import make_tree


def _bundle(*args: str) -> tuple[int, str, str]:
    # No inventory anywhere: a command that read one, or connected, would fail here.
    result = CliRunner().invoke(app, ["bundle", *args], env={"OPSCTL_INVENTORY": "/nonexistent/inventory.yaml"})
    return result.exit_code, result.stdout, result.stderr


def test_bundle_prints_the_release_id_a_deploy_would_ship(tmp_path: Path) -> None:
    tree = make_tree(tmp_path / "tree")
    code, out, err = _bundle("--src", str(tree))
    assert code == 0, err
    assert out.strip() == make_manifest(tree).id
    assert "6 files, " in err and "not a git checkout" in err


def test_bundle_list_names_each_shipped_file_with_its_size(tmp_path: Path) -> None:
    tree = make_tree(tmp_path / "tree")
    code, out, _ = _bundle("--src", str(tree), "--list")
    assert code == 0
    first, *rows = out.splitlines()
    assert first == make_manifest(tree).id
    listed = {row.split()[1]: int(row.split()[0].replace(",", "")) for row in rows}
    expected = {f.path: f.size for f in make_manifest(tree).files}
    assert listed == expected
    assert not any(path.startswith(("kernel/bench/", "backend/bench/")) for path in listed)
    assert any(row.endswith("deploy/build_extension.py  (executable)") for row in rows)


def test_bundle_json_is_for_machines(tmp_path: Path) -> None:
    tree = make_tree(tmp_path / "tree")
    code, out, _ = _bundle("--src", str(tree), "--json")
    doc = json.loads(out)
    manifest = make_manifest(tree)
    assert code == 0 and doc["id"] == manifest.id and "files" not in doc
    assert doc["file_count"] == len(manifest.files) and doc["total_bytes"] == manifest.total_bytes
    listed = json.loads(_bundle("--src", str(tree), "--json", "--list")[1])
    assert [f["path"] for f in listed["files"]] == [f.path for f in manifest.files]
    assert {f["path"]: f["sha256"] for f in listed["files"]} == {f.path: f.sha256 for f in manifest.files}


def test_a_bench_change_leaves_the_printed_id_alone(tmp_path: Path) -> None:
    tree = make_tree(tmp_path / "tree")
    before = _bundle("--src", str(tree))[1]
    (tree / "kernel/bench/profile.txt").write_text("ncu output\n")
    assert _bundle("--src", str(tree))[1] == before
    (tree / "kernel/csrc/k.cu").write_text("__global__ void k2() {}\n")
    assert _bundle("--src", str(tree))[1] != before


def test_bundle_of_something_else_is_one_red_line(tmp_path: Path) -> None:
    code, out, err = _bundle("--src", str(tmp_path), "--json")
    assert code == 30 and "is this the kdtree-engine tree?" in err and "Traceback" not in err
    assert json.loads(out)["exit_code"] == 30
