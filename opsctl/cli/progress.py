"""What a single-host command (deploy, restart, rollback, adopt) shows while it runs and when it ends: the steps,
the gate, and the closing verdict line or JSON document (docs/operator-view.md).

- On a terminal: one live display, the steps with a spinner and, while a parity check or a gate runs, one table
  (a row per TP rank, a column per parity layer; each cell its passes in a row, worst rel and verdict), the
  probe's line and the deadline left. Only new facts print as lines above it (``GateBoard.feed``), and when the
  check ends its summary names the failing ranks and layers. ``--verbose`` prints every line besides.
- Off a terminal (a pipe, CI, a log file), with ``NO_COLOR`` or ``--plain``: nothing redrawn and nothing wrapped,
  one event a line, each with a stable prefix (``✓``/``✗`` a step ended, ``parity``, ``probe``, ``gate:`` the
  gate's progress every ``HEARTBEAT_S``, ``summary``)."""

from __future__ import annotations

import contextlib
import os
import re
import time
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

import typer
from rich.console import Console, Group, RenderableType
from rich.markup import escape as escape_markup
from rich.progress import Progress, ProgressColumn, SpinnerColumn, Task, TaskID, TextColumn
from rich.table import Column, Table
from rich.text import Text

from ..gate.decision import LineVerdict, Verdict
from ..pipeline.report import GateProgress, info_kind
from ..terminal import escaped
from . import common
from .common import escape_brackets as escape
from .gateboard import GateBoard, fmt_rel, probe_text
from .parityview import fmt, verdict_style

if TYPE_CHECKING:
    from .. import pipeline
    from ..gate.lines import ParityLine

console = common.out

HEARTBEAT_S = 15.0  # off a terminal: the gate's progress line at most this often


def plain_wanted(out: Console, plain: bool = False) -> bool:
    """One event a line, nothing redrawn: asked for (--plain), not a terminal, or NO_COLOR set (any value)."""
    return plain or not out.is_terminal or bool(os.environ.get("NO_COLOR"))


class _Seconds(ProgressColumn):
    """Elapsed time of a step with a tenth of a second (steps are often shorter than one)."""

    def render(self, task: Task) -> Text:
        elapsed = task.finished_time if task.finished else task.elapsed
        return Text(f"{elapsed or 0.0:6.1f}s", style="dim")


class _Display(Progress):
    """The steps, and below them the board of the check that runs (if any)."""

    board: GateBoard | None = None

    def get_renderables(self) -> Iterable[RenderableType]:
        if self.board is None:
            yield self.make_tasks_table(self.tasks)
            return
        # While a check runs, its step and its board (a TP 8 board fits a 24-line terminal); the finished steps
        # come back when it ends.
        yield self.make_tasks_table([t for t in self.tasks if not t.finished])
        yield board_view(self.board)


def board_view(board: GateBoard) -> RenderableType:
    """The live table: a row per TP rank, a column per layer; below it the probe and the deadline."""
    title = f"parity of {board.label}" if board.label else "parity"
    head = Text.assemble(
        (title, "bold"),
        (": each layer's verdict, passes in a row, worst rel", "dim"),
    )
    table = Table(box=None)
    table.add_column("rank", style="bold")
    k = board.progress.consecutive_passes if board.progress is not None else 0
    table.add_column(f"passes/{k}" if k else "passes", justify="right")
    layers = board.layers
    for layer in layers:
        table.add_column(f"L{layer}" if layer >= 0 else "L?")
    for rank in board.ranks:
        streak = board.rank_streak.get(rank, 0)
        row: list[RenderableType] = [
            f"TP{rank}" if rank is not None else "-",
            Text(str(streak), style="green" if k and streak >= k else ""),
        ]
        for layer in layers:
            cell = board.cells.get((rank, layer))
            if cell is None:
                row.append(Text("waiting", style="dim"))
                continue
            row.append(
                Text.assemble(
                    (f"{cell.verdict:<4} ", verdict_style(cell.verdict)),
                    (f"{cell.streak}x ", "dim"),
                    (fmt_rel(cell.worst_rel), ""),
                )
            )
        table.add_row(*row)
    p = board.progress
    if p is None:
        return Group(head, table)
    foot = "   ".join(x for x in (probe_text(p), f"deadline: {p.deadline_left_s:.0f}s left") if x)
    return Group(head, table, Text(foot, style="dim"))


# A step whose detail starts with a verdict (the gate's "FAIL: reason") shows that outcome, not a green check.
_OUTCOME = re.compile(rf"^({'|'.join(v for v in Verdict if v is not Verdict.PENDING)})\b")
_SWITCH_TO = re.compile(r"current -> (\S+)")


def _is_check(step: str) -> bool:
    """Steps whose parity lines the board shows: the pre-restart parity and each gate."""
    return step == "parity" or step.startswith("gate")


class RichReporter:
    """A single-host command's progress: live on a terminal, one event a line otherwise (the module's docstring).
    Parity lines name the release they belong to: the new one (``new``, before the restart ``pre-restart``) or
    the rollback's."""

    def __init__(
        self,
        host: str,
        out: Console = console,
        *,
        release: str | None = None,
        action: str = "deploy",
        plain: bool | None = None,
        verbose: bool = False,
    ) -> None:
        self.host = host
        self.release = release
        self.action = action
        self.label = f"{release} ({'new' if action == 'deploy' else action})" if release else ""
        self.progress = _Display(
            SpinnerColumn(finished_text=" "),
            # The description wraps on a narrow terminal: a no_wrap column cannot give way, so rich cut every column
            # to fit instead (the seconds to one digit at 100 columns, the comparison's detail at "decode…").
            TextColumn("{task.description}", table_column=Column(no_wrap=False, overflow="fold", ratio=1)),
            _Seconds(table_column=Column(no_wrap=True, min_width=7, justify="right")),
            console=out,
            transient=False,
            refresh_per_second=4,
        )
        self.tasks: dict[str, TaskID] = {}
        self.live = not plain_wanted(out, bool(plain))
        self.verbose = verbose
        self.out = out
        self.started: dict[str, float] = {}
        self.board: GateBoard | None = None
        self.kinds: set[str] = set()  # the info kinds printed once already
        self.heartbeat_at = 0.0

    def __enter__(self) -> RichReporter:
        if self.live:
            self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.live:
            self.progress.board = None
            self.progress.stop()

    # ------------------------------------------------------------------------------------------------- output

    def _line(self, markup: str, plain: str) -> None:
        """One event: above the live display (markup), or one unwrapped line of text off a terminal. Its pieces may
        come from the host (an ignored line, a step's detail): shown escaped, whichever way it goes out."""
        if self.live:
            self.progress.console.print(escaped(markup), highlight=False)
        else:
            self.out.file.write(escaped(plain.replace("\n", " ")) + "\n")
            self.out.file.flush()

    # -------------------------------------------------------------------------------------------------- steps

    def step(self, name: str, detail: str = "") -> None:
        switch = _SWITCH_TO.search(detail) if name in ("switch", "rollback") else None
        if name == "parity" and self.release:
            self.label = f"{self.release} (new, pre-restart)"
        elif switch and name == "rollback":
            self.label = f"{switch.group(1)} (rollback)"
        elif switch:
            target = switch.group(1)
            self.label = f"{target} (new)" if target == self.release else f"{target} ({self.action})"
        self.started[name] = time.monotonic()
        if _is_check(name):
            self.board = GateBoard(self.label)
            self.progress.board = self.board
            self.heartbeat_at = time.monotonic()
        if self.live:
            self.tasks[name] = self.progress.add_task(
                f"[bold]{escape(name)}[/] {escape(escaped(detail))}".rstrip(), total=1
            )

    def _finish(self, name: str, mark: str, plain_mark: str, detail: str) -> None:
        desc = f"{mark} [bold]{escape(name)}[/]" + (f" [dim]{escape(escaped(detail))}[/]" if detail else "")
        if not self.live:
            if name in self.started:
                secs = time.monotonic() - self.started.pop(name)
                text = f"  {plain_mark} {name}" + (f" {detail}" if detail else "") + f" ({secs:.1f}s)"
                self._line(text, text)
        else:
            task = self.tasks.get(name)
            if task is not None:
                self.progress.update(task, description=desc, completed=1)
                self.progress.stop_task(task)
        if _is_check(name) and self.board is not None:
            self._close_board(self.board)

    def _close_board(self, board: GateBoard) -> None:
        """The check ended: the table goes, and its summary names the failing ranks and layers (nothing more about
        lines after the verdict)."""
        self.board = None
        self.progress.board = None
        if board.failing():
            text = f"  summary {board.label}: {board.summary()}"
            self._line(f"  [bold]summary[/] {escape(board.label)}: [red]{escape(board.summary())}[/]", text)

    def done(self, name: str, detail: str = "") -> None:
        outcome = _OUTCOME.match(detail)
        if outcome and Verdict(outcome.group(1)) is not Verdict.PASS:
            self._finish(name, "[red]✗[/]", "✗", detail)
        else:
            self._finish(name, "[green]✓[/]", "✓", detail)

    def failed(self, name: str, detail: str = "") -> None:
        self._finish(name, "[red]✗[/]", "✗", detail)

    # ---------------------------------------------------------------------------------------------- the gate

    def info(self, message: str) -> None:
        kind = info_kind(message)
        if kind == "probe-wave" and not self.verbose:
            if kind in self.kinds:
                return  # the live probe line (or off a terminal, the gate's progress line) tells the rest
            self.kinds.add(kind)
        self._line(f"  [yellow]{escape(message)}[/]", f"  {message}")

    def parity(self, line: ParityLine, verdict: LineVerdict) -> None:
        # Outside a check (after its verdict) a line is no new fact: only --verbose prints it.
        new = self.board.feed(line, verdict) if self.board is not None else False
        if not (new or self.verbose):
            return
        rank = f" TP{line.rank}" if line.rank is not None else ""
        label = f" {self.label}" if self.label else ""
        figures = f"{line.layer_label}{rank} rel={fmt(line.rel)} max_abs_diff={fmt(line.max_abs_diff)}"
        if line.problems:
            figures += f" malformed: {'; '.join(line.problems)}"
        self._line(
            f"  parity{escape(label)} {escape(figures)} [{verdict_style(verdict)}]{verdict}[/]",
            f"  parity{label} {figures} {verdict}",
        )

    def gate(self, progress: GateProgress) -> None:
        board = self.board
        if board is None:
            return
        board.progress = progress
        if self.live:
            # Drawn once a poll: a poll's batch of lines can be fed and decided between two timed refreshes.
            self.progress.refresh()
            return
        if progress.verdict != Verdict.PENDING:
            return
        now = time.monotonic()
        if now - self.heartbeat_at < HEARTBEAT_S:
            return
        self.heartbeat_at = now
        parts = [f"{progress.deadline_left_s:.0f}s left", board.cells_text()]
        if probe := probe_text(progress):
            parts.append(probe)
        text = f"  gate: {'; '.join(parts)}"
        self._line(escape_markup(text), text)


def _verdict_line(res: pipeline.DeployResult) -> None:
    style = "bold green" if res.ok else "bold red"
    console.print(Text(escaped(res.line()), style=style), soft_wrap=True)


def _json_result(res: pipeline.DeployResult) -> dict[str, Any]:
    return {
        "host": res.host,
        "action": res.action,
        "release": res.release,
        "verdict": res.verdict,
        "ok": res.ok,
        "reason": res.reason,
        "current": res.current_after,
        "rolled_back_to": res.rolled_back_to,
        "rollback_verdict": res.rollback_verdict,
        "gate": res.gate,
        "stage": res.stage,  # where a verdict other than the gate's came from ("comparison")
        "comparison": res.comparison,  # the comparison with the release replaced (docs/gate.md "The comparison")
        "bytes_sent": res.bytes_sent,
        "step_times_s": {k: round(v, 3) for k, v in res.step_times.items()},
        "elapsed_s": round(res.elapsed_s, 3),
    }


@contextlib.contextmanager
def reporter(
    host: str,
    quiet: bool,
    *,
    release: str | None = None,
    action: str = "deploy",
    plain: bool = False,
    verbose: bool = False,
) -> Iterator[pipeline.Reporter]:
    if quiet:
        from ..pipeline.report import NullReporter

        yield NullReporter()
        return
    with RichReporter(host, release=release, action=action, plain=plain, verbose=verbose) as rep:
        yield rep


def finish(res: pipeline.DeployResult, as_json: bool) -> None:
    if as_json:
        common.emit_json(_json_result(res))
    else:
        _verdict_line(res)
    if not res.ok:
        raise typer.Exit(code=res.verdict.exit_code)
