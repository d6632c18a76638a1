"""``opsctl logs``: the unit's journal; parity lines as a table with their verdicts (or, piped, as journal lines
that ``opsctl parity check -`` reads), shapes lines decoded, ``--json`` one object per line."""

from __future__ import annotations

import json
import re
import sys
import time
from collections.abc import Callable
from typing import Annotated, Any

import typer

from ..errors import UsageError
from ..gate.decision import classify
from ..gate.lines import FallbackLine, ParityLine, ShapesLine, parse_line
from ..host import views as hostinfo
from ..inventory import HostConfig
from ..journal.query import message_text
from . import common
from .common import escape_brackets as escape
from .parityview import VERDICT_STYLE, fmt, json_num, parity_table

console = common.out


def logs_command(
    host: common.HostArg = None,
    grep: Annotated[str | None, typer.Option("--grep", help="shapes | parity | a regular expression")] = None,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="keep printing new lines")] = False,
    since: Annotated[
        str | None, typer.Option("--since", help="journalctl time, e.g. '10 min ago' or '2026-05-31 13:00'")
    ] = None,
    lines: Annotated[int, typer.Option("--lines", "-n", help="how many recent lines (without --since)")] = 200,
    as_json: Annotated[bool, typer.Option("--json", help="one JSON object per line")] = False,
    inventory_path: common.InventoryOption = None,
) -> None:
    """The unit's journal; parity lines as a coloured table, shapes lines decoded."""
    h = common.host_of(host, inventory_path, "logs")
    host = h.name
    matcher = _matcher(grep)
    printer = _LogPrinter(h, as_json, stream=follow)
    hostinfo.read_journal(
        h,
        lambda line: printer.feed(line, matcher),
        since=since,
        lines=lines,
        follow=follow,
        kdtree_only=grep in ("shapes", "parity"),
    )
    printer.flush()
    if not printer.matched and not follow:
        window = f"since {since}" if since else f"in the last {lines} lines"
        what = f"matched --grep {grep}" if grep else "was found"
        (common.err if as_json else console).print(
            f"{host}: no journal line of {h.unit}.service {what} ({window}; read {printer.read} lines)",
            style="yellow",
            highlight=False,
            markup=False,
            soft_wrap=True,
        )


def _matcher(grep: str | None) -> Callable[[str, Any], bool]:
    if grep is None:
        return lambda _msg, _rec: True
    if grep == "shapes":
        return lambda _msg, rec: isinstance(rec, ShapesLine)
    if grep == "parity":
        return lambda _msg, rec: isinstance(rec, ParityLine)
    try:
        rx = re.compile(grep)
    except re.error as e:
        raise UsageError(f"--grep {grep!r} is not a valid regular expression: {e}") from None
    return lambda msg, _rec: bool(rx.search(msg))


class _LogPrinter:
    def __init__(self, h: HostConfig, as_json: bool, stream: bool) -> None:
        self.h, self.as_json, self.stream = h, as_json, stream
        self.read = 0  # journal entries read
        self.matched = 0  # of those, shown
        self.parity: list[ParityLine] = []
        self.parity_times: list[str] = []

    def feed(self, raw: str, matcher: Callable[[str, Any], bool]) -> None:
        try:
            doc = json.loads(raw)
        except ValueError:
            return
        self.read += 1
        msg = message_text(doc.get("MESSAGE"))
        when = _fmt_time(doc.get("__REALTIME_TIMESTAMP"))
        rec = parse_line(msg)
        if not matcher(msg, rec):
            return
        self.matched += 1
        if self.as_json:
            sys.stdout.write(json.dumps(_log_json(when, msg, rec, self.h), default=str) + "\n")
            sys.stdout.flush()
        elif isinstance(rec, ParityLine) and not console.is_terminal:
            # Piped: the entry as `journalctl -o short-iso` prints it, so `opsctl parity check -` reads it as the
            # journal itself (the table below is for a terminal).
            # A newline (never in a stdout line; possible from another writer) would make a second line out of
            # the message's middle: U+FFFD keeps it one line, and a marked message with it stays malformed.
            one_line = msg.replace("\n", "\ufffd")
            when = _iso_time(doc.get("__REALTIME_TIMESTAMP"))
            console.file.write(f"{when} {self.h.name} {self.h.unit}: {one_line}\n")
            if self.stream:
                console.file.flush()
        elif isinstance(rec, ParityLine):
            if self.stream:
                v = str(classify(rec, self.h.gate))
                rank = f"TP{rec.rank} " if rec.rank is not None else ""
                console.print(
                    f"{when} {rank}L{rec.layer} max_abs_diff={fmt(rec.max_abs_diff)} mean={fmt(rec.mean)} rel={fmt(rec.rel)} [{VERDICT_STYLE.get(v, '')}]{v}[/]",
                    highlight=False,
                )
            else:
                self.parity.append(rec)
                self.parity_times.append(when)
        elif isinstance(rec, ShapesLine):
            d = rec.decode()
            rank = f"TP{rec.rank} " if rec.rank is not None else ""
            console.print(
                f"{when} {rank}[bold]shapes[/] " + escape(" ".join(f"{k}={v}" for k, v in rec.fields.items())),
                highlight=False,
            )
            console.print(f"    {escape(d.text())}", style="cyan", highlight=False)
            if d.warning:
                console.print(f"    {escape(d.warning)}", style="bold red", highlight=False)
        else:
            console.print(f"{when} {msg}", highlight=False, markup=False)

    def flush(self) -> None:
        if self.parity:
            console.print(parity_table(self.parity, self.h, title="parity", times=self.parity_times))


def _iso_time(us: Any) -> str:
    try:
        return time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(int(us) / 1e6))
    except (TypeError, ValueError):
        return "1970-01-01T00:00:00+0000"


def _fmt_time(us: Any) -> str:
    try:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(int(us) / 1e6))
    except (TypeError, ValueError):
        return "?"


def _log_json(when: str, msg: str, rec: Any, h: HostConfig) -> dict[str, Any]:
    out: dict[str, Any] = {"time": when, "message": msg}
    if isinstance(rec, ParityLine):
        out.update(
            kind="parity",
            layer=rec.layer,
            rank=rec.rank,
            max_abs_diff=json_num(rec.max_abs_diff),
            mean=json_num(rec.mean),
            rel=json_num(rec.rel),
            extra=rec.extra,
            verdict=str(classify(rec, h.gate)),
        )
    elif isinstance(rec, ShapesLine):
        d = rec.decode()
        out.update(kind="shapes", rank=rec.rank, fields=rec.fields, decoded=d.text(), warning=d.warning)
    elif isinstance(rec, FallbackLine):
        out.update(kind="fallback", rank=rec.rank, fields=rec.fields)
    else:
        out["kind"] = "log"
    return out


app = typer.Typer()
app.command("logs")(common.bounded(logs_command))
