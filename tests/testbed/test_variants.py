"""The misbehaving release trees of the rehearsal and the tests (opsctl.testbed.variants), without a host."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from opsctl.release import make_manifest
from opsctl.testbed import variants

REPO = Path(__file__).resolve().parents[2]


def test_seed_bug_drops_exactly_the_tagged_line_and_makes_a_new_release(tmp_path: Path) -> None:
    tree = variants.seed_bug(REPO, tmp_path / "bad")
    good, bad = (REPO / variants.MARSHAL).read_text(), (tree / variants.MARSHAL).read_text()
    removed = [line for line in good.splitlines() if line not in bad.splitlines()]
    assert len(removed) == 1 and variants.DRAFTS_TAG in removed[0] and "key_lens += q_len" in removed[0]
    compile(bad, str(tree / variants.MARSHAL), "exec")  # still valid Python: it runs, wrongly
    assert make_manifest(tree).id != make_manifest(REPO).id


def test_a_tree_without_the_tagged_line_is_refused_by_name() -> None:
    with pytest.raises(variants.VariantError, match=r"marshal\.py: no code line tagged"):
        variants.without_drafts("key_lens = prefix_lens.clone()\n# kdtree:drafts-appended is only a comment here\n")


def test_the_command_line_names_a_tree_that_is_not_one(tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "opsctl",
            "testbed",
            "variant",
            "seed-bug",
            str(tmp_path / "out"),
            "--src",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and "is not a kdtree-engine tree" in proc.stderr


def test_the_command_line_writes_the_tree_it_names(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "opsctl", "testbed", "variant", "seed-bug", str(tmp_path / "out"), "--src", str(REPO)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    tree = Path(proc.stdout.strip())
    assert tree == tmp_path / "out" and variants.DRAFTS_TAG in (tree / variants.MARSHAL).read_text()
    assert "pass  # the seed's bug" in (tree / variants.MARSHAL).read_text()
