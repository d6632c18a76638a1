"""How the commands show a parity line and its verdict: the verdicts' colours, the numbers, the table that
``status`` and ``logs`` print."""

from __future__ import annotations

import math

from rich.table import Table
from rich.text import Text

from ..gate.decision import classify
from ..gate.lines import ParityLine
from ..inventory import HostConfig

VERDICT_STYLE = {
    "PASS": "bold green",
    "FAIL": "bold red",
    "INCONCLUSIVE": "yellow",
    "NODATA": "red",
    "ERROR": "bold red",
    "UNPROVEN": "yellow",
}


def fmt(x: float) -> str:
    return f"{x:.4g}" if math.isfinite(x) else str(x)


def json_num(x: float) -> float | str:
    return x if math.isfinite(x) else str(x)


def parity_table(lines: list[ParityLine], h: HostConfig, title: str = "", times: list[str] | None = None) -> Table:
    table = Table(title=title or None)
    if times:
        table.add_column("time")
    for col in ("rank", "layer", "max_abs_diff", "mean", "rel", "verdict"):
        table.add_column(col, justify="right" if col not in ("verdict",) else "left")
    for i, p in enumerate(lines):
        v = str(classify(p, h.gate))
        row = [
            f"TP{p.rank}" if p.rank is not None else "-",
            f"L{p.layer}",
            fmt(p.max_abs_diff),
            fmt(p.mean),
            fmt(p.rel),
            Text(v, style=VERDICT_STYLE.get(v, "")),
        ]
        table.add_row(*([times[i]] if times else []), *row)
    return table
