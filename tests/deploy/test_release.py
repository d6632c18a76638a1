import json
import subprocess
from pathlib import Path

import pytest

from opsctl.errors import DeployFailed
from opsctl.release import ID_RE, FileEntry, Manifest, list_files, make_manifest, release_id, stage


def make_tree(root: Path, extra: str = "") -> Path:
    for rel, text in {
        "kernel/kdtree_kernel/__init__.py": "x = 1\n",
        "backend/kdtree_backend/__init__.py": "y = 2\n" + extra,
        "deploy/build_extension.py": "print('build')\n",
        "systemd/sglang-k26-ddtree.service": "[Service]\n",
        "kernel/kdtree_kernel/__pycache__/x.cpython-311.pyc": "junk",
        "kernel/build/ext.so": "junk",
        "README.md": "not bundled",
    }.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    (root / "deploy/build_extension.py").chmod(0o755)
    return root


def test_files_selected_without_git(tmp_path: Path) -> None:
    files = list_files(make_tree(tmp_path))
    assert files == [
        "backend/kdtree_backend/__init__.py",
        "deploy/build_extension.py",
        "kernel/kdtree_kernel/__init__.py",
        "systemd/sglang-k26-ddtree.service",
    ]


def test_id_is_content_derived(tmp_path: Path) -> None:
    a = make_manifest(make_tree(tmp_path / "a"), who="x@y")
    b = make_manifest(make_tree(tmp_path / "b"), who="other@host")
    c = make_manifest(make_tree(tmp_path / "c", extra="z = 3\n"), who="x@y")
    assert ID_RE.match(a.id)
    assert a.id == b.id  # same tree, different place/person/time
    assert a.id != c.id
    (tmp_path / "b/deploy/build_extension.py").chmod(0o644)
    assert make_manifest(tmp_path / "b").id != a.id  # the executable bit is content too


def test_id_independent_of_order() -> None:
    f1, f2 = FileEntry("a", "1" * 64, 1, False), FileEntry("b", "2" * 64, 2, True)
    assert release_id([f1, f2]) == release_id([f2, f1])


def test_manifest_roundtrip_and_checklist(tmp_path: Path) -> None:
    m = make_manifest(make_tree(tmp_path))
    back = Manifest.from_json(m.to_json())
    assert back == m
    doc = json.loads(m.to_json())
    assert doc["files"]["deploy/build_extension.py"]["executable"] is True
    assert m.checklist().count("\n") == len(m.files)


def test_git_provenance_and_ignored_files(tmp_path: Path) -> None:
    root = make_tree(tmp_path)
    (root / ".gitignore").write_text("*.log\n")
    (root / "backend/debug.log").write_text("ignored")
    git = ["git", "-C", str(root), "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "init"], check=True)
    m = make_manifest(root)
    assert m.commit and len(m.commit) == 40 and m.dirty is False
    assert "backend/debug.log" not in [f.path for f in m.files]
    (root / "backend/kdtree_backend/__init__.py").write_text("changed\n")
    m2 = make_manifest(root)
    assert m2.dirty is True and m2.id != m.id


def test_stage_copies_files_and_manifest(tmp_path: Path) -> None:
    src = make_tree(tmp_path / "src")
    m = make_manifest(src)
    out = stage(src, m, tmp_path / "out")
    assert json.loads((out / "manifest.json").read_text())["id"] == m.id
    assert (out / "deploy/build_extension.py").stat().st_mode & 0o100
    assert not (out / "README.md").exists()


def test_not_a_tree(tmp_path: Path) -> None:
    with pytest.raises(DeployFailed):
        make_manifest(tmp_path)
