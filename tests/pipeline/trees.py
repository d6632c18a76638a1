"""Release trees for the testbed tests: real copies of this repository's tree, some with one deliberate change."""

from __future__ import annotations

import json
import os
from pathlib import Path

from opsctl.testbed import variants

REPO = Path(__file__).resolve().parents[2]
# For working on these tests with a stand-in tree; unset in CI, where the repository's own tree is used.
SOURCE = Path(os.environ.get("KDTREE_DEPLOY_TEST_TREE") or REPO)


def copy_tree(dest: Path, tag: str = "") -> Path:
    """A copy of the bundle dirs; ``tag`` adds a marker file so that the release id differs."""
    return variants.copy_tree(SOURCE, dest, tag)


def classic_bug(dest: Path, tag: str = "classic-bug") -> Path:
    """The marshaling bug of docs/sglang-verify.md, made as the rehearsal makes it (opsctl.testbed.variants)."""
    return variants.seed_bug(SOURCE, dest, tag)


def with_standin(tree: Path, **standin: object) -> Path:
    """Set keys of the ``standin`` section of the tree's deploy/kdtree.json (the testbed unit's stand-in server:
    ``fault``, ``load_delay_s``; docs/testbed.md). The pre-restart check runs the replay, which ignores them."""
    config = tree / "deploy" / "kdtree.json"
    data = json.loads(config.read_text())
    data.setdefault("standin", {}).update(standin)
    config.write_text(json.dumps(data, indent=2) + "\n")
    return tree


def crash_loop(dest: Path, tag: str = "crash-loop") -> Path:
    """The service process dies when its model has loaded, at every start (the pre-restart check still works)."""
    return with_standin(copy_tree(dest, tag), fault="crash-at-load")


def silent(dest: Path) -> Path:
    """The service runs and answers requests but never prints a parity line (parity mode off)."""
    tree = copy_tree(dest, "silent")
    config = tree / "deploy" / "kdtree.json"
    data = json.loads(config.read_text())
    data["parity"]["enabled"] = False
    config.write_text(json.dumps(data, indent=2) + "\n")
    return tree


def build_fails(dest: Path) -> Path:
    tree = copy_tree(dest, "build-fails")
    (tree / "deploy" / "build_extension.py").write_text(
        "import sys\nprint('error: simulated compile failure in verify_attention.cu', file=sys.stderr)\nsys.exit(4)\n"
    )
    return tree


def slow_build(dest: Path, seconds: int = 60) -> Path:
    tree = copy_tree(dest, "slow-build")
    (tree / "deploy" / "build_extension.py").write_text(f"import time\ntime.sleep({seconds})\nraise SystemExit(3)\n")
    return tree
