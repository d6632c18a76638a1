"""What a single-host command (deploy, restart, rollback, adopt) shows while it runs and when it ends: the live
step display with the parity lines above it (``RichReporter``), and the closing verdict line or JSON document."""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Iterator
from typing import Any

import typer
from rich.console import Console
from rich.progress import Progress, ProgressColumn, SpinnerColumn, Task, TaskID, TextColumn
from rich.text import Text

from .. import pipeline
from ..gate.decision import LineVerdict, Verdict
from ..gate.lines import ParityLine
from . import common
from .common import escape_brackets as escape
from .parityview import fmt, verdict_style

console = common.out


class _Seconds(ProgressColumn):
    """Elapsed time of a step with a tenth of a second (steps are often shorter than one)."""

    def render(self, task: Task) -> Text:
        elapsed = task.finished_time if task.finished else task.elapsed
        return Text(f"{elapsed or 0.0:6.1f}s", style="dim")


# A step whose detail starts with a verdict (the gate's "FAIL: reason") shows that outcome, not a green check.
_OUTCOME = re.compile(rf"^({'|'.join(v for v in Verdict if v is not Verdict.PENDING)})\b")
_SWITCH_TO = re.compile(r"current -> (\S+)")


class RichReporter:
    """One row per step with a spinner and its elapsed time; parity lines printed above as they arrive, each naming
    the release it belongs to: the new one (``new``, before the restart ``pre-restart``) or the rollback's.

    Not on a terminal (CI, a log file), nothing is redrawn: each step prints one line when it ends, in order with
    the parity lines."""

    def __init__(
        self, host: str, out: Console = console, *, release: str | None = None, action: str = "deploy"
    ) -> None:
        self.host = host
        self.release = release
        self.action = action
        self.label = f"{release} ({'new' if action == 'deploy' else action})" if release else ""
        self.progress = Progress(
            SpinnerColumn(finished_text=" "),
            TextColumn("{task.description}"),
            _Seconds(),
            console=out,
            transient=False,
        )
        self.tasks: dict[str, TaskID] = {}
        self.live = out.is_terminal
        self.out = out
        self.started: dict[str, float] = {}

    def __enter__(self) -> RichReporter:
        if self.live:
            self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.live:
            self.progress.stop()

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
        if self.live:
            self.tasks[name] = self.progress.add_task(f"[bold]{name}[/] {escape(detail)}".rstrip(), total=1)

    def _finish(self, name: str, mark: str, detail: str) -> None:
        desc = f"{mark} [bold]{name}[/]" + (f" [dim]{escape(detail)}[/]" if detail else "")
        if not self.live:
            if name in self.started:
                secs = time.monotonic() - self.started.pop(name)
                self.out.print(f"  {desc} [dim]({secs:.1f}s)[/]", highlight=False, soft_wrap=True)
            return
        task = self.tasks.get(name)
        if task is None:
            return
        self.progress.update(task, description=desc, completed=1)
        self.progress.stop_task(task)

    def done(self, name: str, detail: str = "") -> None:
        outcome = _OUTCOME.match(detail)
        if outcome and Verdict(outcome.group(1)) is not Verdict.PASS:
            self._finish(name, "[red]✗[/]", detail)
        else:
            self._finish(name, "[green]✓[/]", detail)

    def failed(self, name: str, detail: str = "") -> None:
        self._finish(name, "[red]✗[/]", detail)

    def info(self, message: str) -> None:
        self.progress.console.print(f"[yellow]{escape(message)}[/]")

    def parity(self, line: ParityLine, verdict: LineVerdict) -> None:
        rank = f" TP{line.rank}" if line.rank is not None else ""
        style = verdict_style(verdict)
        label = f" {escape(self.label)}" if self.label else ""
        self.progress.console.print(
            f"  parity{label} L{line.layer}{rank} rel={fmt(line.rel)} max_abs_diff={fmt(line.max_abs_diff)} [{style}]{verdict}[/]",
            highlight=False,
        )


def _verdict_line(res: pipeline.DeployResult) -> None:
    style = "bold green" if res.ok else "bold red"
    console.print(Text(res.line(), style=style))


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
        "bytes_sent": res.bytes_sent,
        "step_times_s": {k: round(v, 3) for k, v in res.step_times.items()},
        "elapsed_s": round(res.elapsed_s, 3),
    }


@contextlib.contextmanager
def reporter(
    host: str, quiet: bool, *, release: str | None = None, action: str = "deploy"
) -> Iterator[pipeline.Reporter]:
    if quiet:
        yield pipeline.NullReporter()
        return
    with RichReporter(host, release=release, action=action) as rep:
        yield rep


def finish(res: pipeline.DeployResult, as_json: bool) -> None:
    if as_json:
        common.emit_json(_json_result(res))
    else:
        _verdict_line(res)
    if not res.ok:
        raise typer.Exit(code=res.verdict.exit_code)
