"""What the live gate view knows of one gate (or one pre-restart parity run), and which parity lines are new facts
worth a line of their own. Pure: parity lines and the gate's progress in, cells and decisions out; progress.py
draws it.

A cell is one TP rank on one parity layer: its passes in a row, its worst ``rel`` and its newest line's verdict.
A line prints (``feed`` says True) when it is a new fact: the first line of its verdict, and the first FAIL or
INCONCLUSIVE of each rank and layer; a repeat of those only counts (``repeats``), and a PASS after the first
only updates its cell."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..gate.decision import LineVerdict
from ..gate.lines import ParityLine
from ..pipeline.report import GateProgress

Cell = tuple[int | None, int]  # (rank, layer)


@dataclass
class CellState:
    streak: int = 0  # passes in a row
    worst_rel: float = 0.0  # NaN is the worst of all
    verdict: LineVerdict = LineVerdict.PASS  # the newest line's
    lines: int = 0
    malformed: str = ""  # the newest malformed line's problems


def _worse(a: float, b: float) -> bool:
    """Whether ``a`` is a worse rel than ``b`` (NaN worst, then the larger)."""
    if math.isnan(b):
        return False
    return math.isnan(a) or a > b


@dataclass
class GateBoard:
    label: str  # whose lines: "r1 (new)", "r0 (rollback)", "r1 (new, pre-restart)"
    cells: dict[Cell, CellState] = field(default_factory=dict)
    repeats: dict[tuple[Cell, LineVerdict], int] = field(default_factory=dict)  # FAIL/INCONCLUSIVE after the first
    kinds: set[LineVerdict] = field(default_factory=set)
    progress: GateProgress | None = None
    rank_streak: dict[int | None, int] = field(default_factory=dict)  # passes in a row per rank, as the gate counts

    def feed(self, line: ParityLine, verdict: LineVerdict) -> bool:
        """Count one judged line into its cell; True when it is a new fact (print it), False when the cell (and a
        repeat count) tells it."""
        key: Cell = (line.rank, line.layer)
        cell = self.cells.setdefault(key, CellState())
        cell.lines += 1
        cell.verdict = verdict
        cell.streak = cell.streak + 1 if verdict is LineVerdict.PASS else 0
        self.rank_streak[line.rank] = self.rank_streak.get(line.rank, 0) + 1 if verdict is LineVerdict.PASS else 0
        if line.problems:
            cell.malformed = "; ".join(line.problems)
        if cell.lines == 1 or _worse(line.rel, cell.worst_rel):
            cell.worst_rel = line.rel
        first_of_kind = verdict not in self.kinds
        self.kinds.add(verdict)
        if verdict is LineVerdict.PASS:
            return first_of_kind
        seen = (key, verdict) in self.repeats
        self.repeats[(key, verdict)] = self.repeats.get((key, verdict), -1) + 1
        return first_of_kind or not seen

    @property
    def ranks(self) -> list[int | None]:
        """The rows: every rank of the unit's TP size (when known) and any other that printed."""
        known: set[int | None] = {rank for rank, _ in self.cells}
        if self.progress is not None and self.progress.expected_ranks is not None:
            known |= set(range(self.progress.expected_ranks))
        return sorted(known, key=lambda r: -1 if r is None else r)

    @property
    def layers(self) -> list[int]:
        return sorted({layer for _, layer in self.cells})

    def failing(self) -> list[tuple[Cell, LineVerdict, int, float]]:
        """Each rank and layer that printed a FAIL or INCONCLUSIVE line: its verdict, how many such lines, its worst
        rel; FAILs first, then by rank and layer."""
        out = []
        for (cell, verdict), repeats in self.repeats.items():
            out.append((cell, verdict, repeats + 1, self.cells[cell].worst_rel))
        order = {LineVerdict.FAIL: 0, LineVerdict.INCONCLUSIVE: 1}
        return sorted(out, key=lambda x: (order.get(x[1], 2), -1 if x[0][0] is None else x[0][0], x[0][1]))

    def cells_text(self) -> str:
        """``5 of 6 rank-layer cells passing``; before any parity line (a gate without verify traffic, UNPROVEN at
        its deadline) ``no parity line yet``, not "0 of 0"."""
        if not self.cells:
            return "no parity line yet"
        n = sum(1 for c in self.cells.values() if c.verdict is LineVerdict.PASS)
        return f"{n} of {len(self.cells)} rank-layer cells passing"

    def summary(self, limit: int = 4) -> str:
        """One line: the failing ranks and layers (``FAIL TP3 L12 rel=0.41 x12; INCONCLUSIVE TP1 L0 x2``), or how
        many cells passed."""
        bad = self.failing()
        if not bad:
            if not self.cells:
                return self.cells_text()
            lines = sum(c.lines for c in self.cells.values())
            return f"{self.cells_text()} ({lines} lines)"
        parts = [
            f"{verdict} {where(cell)}"
            + (f" ({self.cells[cell].malformed})" if self.cells[cell].malformed else f" rel={fmt_rel(worst)}")
            + (f" x{count}" if count > 1 else "")
            for cell, verdict, count, worst in bad[:limit]
        ]
        more = f"; {len(bad) - limit} more" if len(bad) > limit else ""
        return "; ".join(parts) + more


def where(cell: Cell) -> str:
    rank, layer = cell
    return (f"TP{rank} " if rank is not None else "") + ("L?" if layer < 0 else f"L{layer}")


def fmt_rel(x: float) -> str:
    return f"{x:.3g}" if math.isfinite(x) else str(x)


def probe_text(p: GateProgress) -> str:
    """``probe: 24 sent, 24 answered, TTFT 12-31 ms`` (or waiting for readiness; empty without the probe)."""
    if not p.probing:
        return ""
    if not p.ready:
        return "probe: waiting for the server to be ready"
    text = f"probe: {p.sent} sent, {p.answered} answered"
    if p.failed:
        text += f", {p.failed} failed"
    if p.ttft_ms is not None:
        text += f", TTFT {p.ttft_ms[0]:.0f}-{p.ttft_ms[1]:.0f} ms"
    return text
