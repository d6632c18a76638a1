"""The gate view's cosmetics (issue 47 item 9): a gate with no parity line says so (not "0 of 0 rank-layer cells
passing"), and at 100 columns the step times stay whole and a long detail (the comparison's) wraps instead of being
cut at "decode…"."""

from __future__ import annotations

import io
import re
from unittest import mock

from rich.console import Console

from opsctl.cli import progress
from opsctl.cli.gateboard import GateBoard
from opsctl.cli.progress import RichReporter
from opsctl.pipeline.report import GateProgress

COMPARISON = (
    "PASS: compared with r10a3b0f25076 on 16 requests: 16/16 answers identical; decode 1.02x (p=0.41), "
    "accepted drafts 1.00x"
)


def test_a_gate_without_lines_says_so() -> None:
    board = GateBoard("r1 (new)")
    assert board.summary() == "no parity line yet" and board.cells_text() == "no parity line yet"
    buf = io.StringIO()
    rep = RichReporter("h", Console(file=buf, width=80), release="r1", plain=True)
    rep.step("gate")
    with mock.patch.object(progress, "HEARTBEAT_S", 0.0):
        rep.gate(GateProgress(120, 2, 3, True, True))
    assert "  gate: 120s left; no parity line yet; probe: " in buf.getvalue()
    assert "0 of 0" not in buf.getvalue()


def test_at_100_columns_the_times_stay_whole_and_the_comparison_wraps() -> None:
    buf = io.StringIO()
    console = Console(file=buf, width=100, force_terminal=True, color_system=None)
    rep = RichReporter("tb2", console, release="r10a3b0f25076")
    with rep:
        for name, detail in (
            ("upload", "53 files + manifest (0 sent, 53 linked from r10a3b0f25076), 2551 bytes"),
            ("comparison", COMPARISON),
            ("gate", "PASS: 3 consecutive passing parity lines on each of 8 ranks (rel <= 0.01)"),
        ):
            rep.step(name)
            rep.done(name, detail)
    # The last frame: what the terminal keeps (cursor moves and the redrawn frames before it dropped).
    last = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", buf.getvalue()).split("\r")[-1]
    lines = [line.rstrip() for line in last.splitlines() if line.strip()]
    steps = [line for line in lines if "✓" in line]
    assert len(steps) == 3 and all(re.search(r" \d+\.\ds$", line) for line in steps), lines
    assert all(len(line) <= 100 for line in lines)
    text = " ".join(line.strip() for line in lines)
    assert "decode 1.02x (p=0.41), accepted drafts 1.00x" in text and "…" not in text
