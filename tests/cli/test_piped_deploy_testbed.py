"""A deploy's output through a pipe at COLUMNS=80 (issue 38), on a real testbed host: one event a line, none broken
mid-phrase (every line starts with one of the output's stable prefixes, and lines longer than 80 columns stay
whole), no live table and no terminal control codes."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from opsctl.inventory import Inventory
from opsctl.release import make_manifest
from tests.pipeline import trees

REPO = Path(__file__).resolve().parents[2]

# The first words a piped deploy's lines start with (docs/operator-view.md "Piped and CI output").
PREFIXES = re.compile(
    r"^(deploy \S+ to |  \d+\. |  probe|  comparison|  note: |  gate rules: |  gate: |  [✓✗] |  parity |"
    r"  summary |  ignored |  WARNING|  SSH trouble|\S+: deploy \S+ -> )"
)


@pytest.mark.testbed
def test_a_piped_deploy_keeps_one_event_a_line_at_80_columns(testbed: Inventory, tmp_path: Path) -> None:
    tree = trees.copy_tree(tmp_path / "tree", tag="piped-80")
    release = make_manifest(tree).id
    command = [sys.executable, "-m", "opsctl", "-i", str(testbed.path), "deploy", "tb1", "--yes", "--src", str(tree)]
    proc = subprocess.run(
        ["sh", "-c", 'exec "$@" | cat', "sh", *command],
        capture_output=True,
        text=True,
        timeout=600,
        stdin=subprocess.DEVNULL,
        cwd=REPO,
        env={**os.environ, "COLUMNS": "80", "TERM": "xterm-256color"},
    )
    out = proc.stdout
    assert f"tb1: deploy {release} -> PASS" in out, out + proc.stderr
    lines = out.splitlines()
    broken = [line for line in lines if line and not PREFIXES.match(line)]
    assert not broken, "lines that do not start an event (a wrapped line's tail?):\n" + "\n".join(broken)
    assert any(len(line) > 80 for line in lines)  # long events stay whole at COLUMNS=80
    assert "\x1b[" not in out and "passes/" not in out  # no colour, no live table
    assert len(lines) < 60, out
