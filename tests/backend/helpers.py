"""Shared helpers of the backend tests: a release-like copy of the backend with the classic bug, line parsing."""

from __future__ import annotations

import importlib.util
import re
import shutil
import sys
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[2]
BACKEND_PKG = REPO / "backend" / "kdtree_backend"
MARKERS = {"drafts": "# kdtree:drafts-appended", "stride": "# kdtree:row-stride"}
PARITY_RE = re.compile(r"^\[kdtree\] L(\d+) max_abs_diff=(\S+) mean=(\S+) rel=(\S+) tp=(\d+)(?: token=\S+)?$")
SHAPES_RE = re.compile(
    r"^\[kdtree\] shapes q=\((\d+), (\d+), (\d+)\) kv_buf=\((\d+), (\d+)\) bs=(\d+) q_len=(\d+) Dl=(\d+) "
    r"Dr=(\d+) kv_len_max=(\d+) scale=(\S+) mask=\((\d+),\)"
)


def with_bug(source: str, bug: str) -> str:
    """marshal.py's text with the marked line dropped the way the deploy tests do it (replaced by ``pass``)."""
    marker = MARKERS[bug]
    out = []
    hits = 0
    for line in source.splitlines(keepends=True):
        if marker in line and not line.lstrip().startswith("#"):
            indent = line[: len(line) - len(line.lstrip())]
            out.append(f"{indent}pass  # bug: {line.strip()}\n")
            hits += 1
        else:
            out.append(line)
    assert hits == 1, f"expected exactly one code line marked {marker!r}, found {hits}"
    return "".join(out)


def buggy_marshal_module(bug: str, tmp_path: Path) -> ModuleType:
    """Import a copy of marshal.py carrying the classic bug, as a standalone module."""
    path = tmp_path / f"marshal_{bug}.py"
    path.write_text(with_bug((BACKEND_PKG / "marshal.py").read_text(), bug))
    spec = importlib.util.spec_from_file_location(f"marshal_{bug}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def buggy_release(bug: str, tmp_path: Path) -> Path:
    """A release-like tree (kernel/ + backend/) whose marshal.py carries the classic bug."""
    root = tmp_path / f"release-{bug}"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "build", "*.so")
    shutil.copytree(REPO / "kernel", root / "kernel", ignore=ignore)
    shutil.copytree(REPO / "backend", root / "backend", ignore=ignore)
    marshal = root / "backend" / "kdtree_backend" / "marshal.py"
    marshal.write_text(with_bug(marshal.read_text(), bug))
    return root


def replay_env(root: Path) -> dict[str, str]:
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith("KDTREE_")}
    env["PYTHONPATH"] = f"{root / 'kernel'}:{root / 'backend'}"
    env["PYTHONUNBUFFERED"] = "1"
    return env


PYTHON = sys.executable
