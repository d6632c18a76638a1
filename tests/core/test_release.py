import ast
import importlib.util
import json
import re
import subprocess
from pathlib import Path

import pytest

from opsctl.errors import DeployFailed
from opsctl.release import ID_RE, FileEntry, Manifest, list_files, make_manifest, release_id, shipped, stage

REPO = Path(__file__).resolve().parents[2]


def make_tree(root: Path, extra: str = "") -> Path:
    for rel, text in {
        "kernel/kdtree_kernel/__init__.py": "x = 1\n",
        "backend/kdtree_backend/__init__.py": "y = 2\n" + extra,
        "deploy/build_extension.py": "print('build')\n",
        "systemd/sglang-k26-ddtree.service": "[Service]\n",
        "kernel/csrc/k.cu": "__global__ void k() {}\n",
        "backend/kdtree_backend_plugin-0.1.0.dist-info/entry_points.txt": "[sglang.srt.plugins]\n",
        "kernel/kdtree_kernel/__pycache__/x.cpython-311.pyc": "junk",
        "kernel/build/ext.so": "junk",
        "kernel/bench/bench_verify.py": "research\n",
        "backend/bench/capture_bench.py": "research\n",
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
        "backend/kdtree_backend_plugin-0.1.0.dist-info/entry_points.txt",
        "deploy/build_extension.py",
        "kernel/csrc/k.cu",
        "kernel/kdtree_kernel/__init__.py",
        "systemd/sglang-k26-ddtree.service",
    ]


@pytest.mark.parametrize(
    "research",
    ["kernel/bench/probe_mma.py", "kernel/bench/profiles/ncu.txt", "backend/bench/new_bench.py", "kernel/notes.md"],
)
def test_research_files_do_not_change_the_release_id(tmp_path: Path, research: str) -> None:
    before = make_manifest(make_tree(tmp_path))
    (tmp_path / research).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / research).write_text("a new measurement\n")
    (tmp_path / "kernel/bench/bench_verify.py").write_text("research, edited\n")
    after = make_manifest(tmp_path)
    assert after.id == before.id and after.files == before.files


def test_shipped_is_an_allow_list() -> None:
    assert shipped("kernel/csrc/verify_attention.cu") and shipped("backend/kdtree_backend/replay.py")
    assert shipped("backend/kdtree_backend_plugin-0.1.0.dist-info/METADATA") and shipped("deploy/kdtree.json")
    assert not shipped("kernel/bench/trace-kernel.diff") and not shipped("backend/bench/capture_bench.py")
    assert not shipped("kernel/new_research_dir/x.py")  # a directory nobody named stays behind
    assert not shipped("tests/core/test_release.py") and not shipped("docs/release-layout.md")
    assert not shipped("kernel/kdtree_kernel/__pycache__/ops.cpython-311.pyc")


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
    (root / "kernel/bench/bench_verify.py").write_text("edited research\n")
    (root / "backend/bench/untracked_probe.py").write_text("new research\n")
    assert make_manifest(root).dirty is False  # research edits do not make the bundle dirty
    (root / "backend/kdtree_backend/__init__.py").write_text("changed\n")
    m2 = make_manifest(root)
    assert m2.dirty is True and m2.id != m.id
    subprocess.run([*git, "commit", "-qam", "backend changed"], check=True)
    subprocess.run([*git, "mv", "kernel/csrc/k.cu", "kernel/bench/k_variant.cu"], check=True)
    assert make_manifest(root).dirty is True  # a shipped file moved into research: the bundle lost it


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


# ---------------------------------------------------------------------------------------------- this repository


def _repo_bundle() -> set[str]:
    return {f.path for f in make_manifest(REPO).files}


def test_repository_bundle_holds_no_research_tests_or_docs() -> None:
    files = _repo_bundle()
    tops = {"/".join(p.split("/")[:2]) for p in files}
    assert not {t for t in tops if t in ("kernel/bench", "backend/bench") or t.split("/")[0] in ("tests", "docs")}
    assert {"deploy/build_extension.py", "deploy/kdtree.json", "systemd/sglang-k26-ddtree.service"} <= files


def test_repository_bundle_holds_what_the_host_build_compiles_and_includes() -> None:
    """Every source deploy/build_extension.py compiles, and every header those include (transitively), ships."""
    spec = importlib.util.spec_from_file_location("build_extension", REPO / "deploy/build_extension.py")
    assert spec is not None and spec.loader is not None
    build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build)
    files = _repo_bundle()
    todo = [f"kernel/csrc/{name}" for name in build.SOURCES]
    seen: set[str] = set()
    while todo:
        rel = todo.pop()
        if rel in seen:
            continue
        seen.add(rel)
        assert rel in files, f"{rel} is compiled on the host but not shipped"
        for header in re.findall(r'^\s*#\s*include\s+"([^"]+)"', (REPO / rel).read_text(), re.MULTILINE):
            todo.append(str(Path(rel).parent / header))
    assert len(seen) > len(build.SOURCES)  # the walk did reach the headers


def test_repository_bundle_holds_every_module_the_shipped_packages_import() -> None:
    files = _repo_bundle()
    roots = {"kdtree_kernel": "kernel", "kdtree_backend": "backend"}
    for rel in sorted(p for p in files if p.endswith(".py") and p.split("/")[1] in roots):
        for node in ast.walk(ast.parse((REPO / rel).read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module:
                package = rel.split("/")[1] if node.level == 1 else ""  # `from .x import` is its own package's
                names = [f"{package}.{node.module}" if package else node.module]
            for name in names:
                parts = name.split(".")
                if parts[0] in roots:
                    base = "/".join([roots[parts[0]], *parts])
                    assert f"{base}.py" in files or f"{base}/__init__.py" in files, f"{rel} imports {name}"
