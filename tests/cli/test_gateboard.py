"""The gate view's rules (issue 38), pure: which parity lines are new facts, the repeat counts, the summary that
names failing ranks and layers, the rank's passes in a row; and the reporter off a terminal: one unwrapped event a
line, only new facts (every line with --verbose), nothing about lines after the check ended."""

from __future__ import annotations

import io

from rich.console import Console

from opsctl.cli.gateboard import GateBoard
from opsctl.cli.progress import RichReporter
from opsctl.gate.decision import LineVerdict
from opsctl.gate.lines import ParityLine, parse_line
from opsctl.pipeline.report import GateProgress

P, F, INC = LineVerdict.PASS, LineVerdict.FAIL, LineVerdict.INCONCLUSIVE


def line(layer: int, rank: int, rel: float) -> ParityLine:
    rec = parse_line(f"[kdtree] L{layer} max_abs_diff=1.0e-03 mean=1.0e-04 rel={rel:.3e} tp={rank}")
    assert isinstance(rec, ParityLine)
    return rec


def test_only_new_facts_print_and_repeats_are_counted() -> None:
    board = GateBoard("r1 (new)")
    shown = [
        board.feed(line(0, 0, 1e-3), P),  # the first PASS: a new fact
        board.feed(line(0, 1, 1e-3), P),  # another PASS: the cell tells it
        board.feed(line(30, 3, 0.02), INC),  # the first INCONCLUSIVE
        board.feed(line(30, 3, 0.03), INC),  # its repeat on the same rank and layer: counted
        board.feed(line(60, 3, 0.02), INC),  # the same rank, another layer: new
        board.feed(line(30, 5, 0.9), F),  # the first FAIL
        board.feed(line(30, 5, 0.8), F),  # repeat
        board.feed(line(30, 5, 0.7), F),  # repeat
    ]
    assert shown == [True, False, True, False, True, True, False, False]
    assert board.summary() == "FAIL TP5 L30 rel=0.9 x3; INCONCLUSIVE TP3 L30 rel=0.03 x2; INCONCLUSIVE TP3 L60 rel=0.02"
    assert board.cells[(3, 30)].worst_rel == 0.03 and board.cells[(5, 30)].streak == 0


def test_the_rank_streak_is_the_gates_count_across_layers() -> None:
    board = GateBoard("r1 (new)")
    for layer in (0, 30, 60, 0):
        board.feed(line(layer, 0, 1e-3), P)
    board.feed(line(30, 1, 0.02), INC)
    board.feed(line(60, 1, 1e-3), P)
    assert board.rank_streak == {0: 4, 1: 1}
    board.progress = GateProgress(100, 8, 3, True, True)
    assert board.ranks == list(range(8))  # every rank of the unit's TP size, waiting ones too
    assert board.layers == [0, 30, 60]
    assert board.summary() == "INCONCLUSIVE TP1 L30 rel=0.02"
    passing = GateBoard("r1 (new)")
    for rank in range(2):
        passing.feed(line(0, rank, 1e-3), P)
    assert passing.summary() == "2 of 2 rank-layer cells passing (2 lines)"


def _reporter(verbose: bool = False) -> tuple[RichReporter, io.StringIO]:
    buf = io.StringIO()
    return RichReporter("h", Console(file=buf, width=80), release="r1", plain=True, verbose=verbose), buf


def test_off_a_terminal_one_unwrapped_event_a_line_and_only_new_facts() -> None:
    rep, buf = _reporter()
    with rep:
        rep.step("gate")
        for wave in range(1, 21):
            rep.info(f"probe wave {wave}: 8 sent, 8 answered, TTFT 10-20 ms (0.3s)")
            for rank in range(8):
                for layer in (0, 30, 60):
                    bad = rank == 5 and layer == 30
                    rep.parity(line(layer, rank, 0.9 if bad else 1e-3), F if bad else P)
        rep.gate(GateProgress(10, 8, 3, True, True, 160, 160, 0, 20, (10.0, 20.0), "FAIL"))
        rep.done("gate", "FAIL: parity L30 TP5 rel=0.9 >= fail threshold 0.05, a reason long enough to pass 80 columns")
        rep.parity(line(0, 0, 1e-3), P)  # a line after the check ended: nothing about it
    lines = buf.getvalue().splitlines()
    assert len(lines) == 5, lines  # first wave, first PASS, first FAIL, the step, the summary
    assert lines[0].startswith("  probe wave 1:") and sum("probe wave" in x for x in lines) == 1
    assert [x.split()[-1] for x in lines if x.startswith("  parity ")] == ["PASS", "FAIL"]
    assert lines[3].startswith("  ✗ gate FAIL:") and len(lines[3]) > 80  # whole, never wrapped at 80 columns
    assert lines[4] == "  summary r1 (new): FAIL TP5 L30 rel=0.9 x20"


def test_verbose_prints_every_line() -> None:
    rep, buf = _reporter(verbose=True)
    with rep:
        rep.step("gate")
        for wave in range(1, 4):
            rep.info(f"probe wave {wave}: 8 sent, 8 answered (0.3s)")
            for rank in range(8):
                rep.parity(line(0, rank, 1e-3), P)
        rep.done("gate", "PASS: 3 consecutive passing parity lines on each of 8 ranks")
    text = buf.getvalue()
    assert text.count("  parity ") == 24 and text.count("probe wave") == 3
