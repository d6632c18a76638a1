"""Release trees for the testbed tests: real copies of this repository's tree, some with one deliberate change."""

from __future__ import annotations

import os
import re
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


_SERVICE_MODE = "import sys as _s\n_service = '--steps' in _s.argv and _s.argv[_s.argv.index('--steps') + 1] == '0'\n"


def _prepend_to_replay(tree: Path, code: str) -> None:
    replay = tree / "backend" / "kdtree_backend" / "replay.py"
    text = replay.read_text()
    # After a module docstring / __future__ import, so the file stays valid Python.
    m = re.search(r"^from __future__ import annotations\n", text, re.M)
    at = m.end() if m else 0
    replay.write_text(text[:at] + _SERVICE_MODE + code + text[at:])


def crash_loop(dest: Path, tag: str = "crash-loop") -> Path:
    """The service process dies at start (the one-shot pre-restart parity run still works)."""
    tree = copy_tree(dest, tag)
    _prepend_to_replay(
        tree, "if _service:\n    print('simulated crash at start', flush=True)\n    raise SystemExit(1)\n"
    )
    return tree


def silent(dest: Path) -> Path:
    """The service runs but never prints a parity line (e.g. parity mode off or a hang in model load)."""
    tree = copy_tree(dest, "silent")
    _prepend_to_replay(tree, "if _service:\n    import time as _t\n    while True:\n        _t.sleep(3600)\n")
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
