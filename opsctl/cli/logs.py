"""``opsctl logs``: the unit's journal; parity lines with their verdicts (a table on a terminal; piped, one decoded
line an entry), shapes lines decoded, ``--raw`` the journal's own text (what ``opsctl parity check -`` reads),
``--json`` one object per line."""

from __future__ import annotations

import json
import re
import sys
import time
from collections.abc import Callable
from typing import Annotated, Any

import typer

from ..errors import UsageError
from ..gate.decision import Judgement, LineVerdict
from ..gate.lines import FallbackLine, KdtreeLine, ParityLine, ShapesLine, parse_line
from ..host import views
from ..inventory import HostConfig
from ..journal.query import message_text
from ..terminal import escaped
from . import common
from .common import escape_brackets as escape
from .parityview import LineJudge, fmt, parity_table, verdict_style

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
    raw: Annotated[
        bool,
        typer.Option("--raw", help="the journal's text (short-iso), undecoded: what `opsctl parity check -` reads"),
    ] = False,
    inventory_path: common.InventoryOption = None,
) -> None:
    """The unit's journal; parity lines as a coloured table, shapes lines decoded."""
    h = common.host_of(host, inventory_path, "logs")
    host = h.name
    matcher = _matcher(grep)
    printer = _LogPrinter(h, as_json, stream=follow, raw=raw)
    views.read_journal(
        h,
        lambda line: printer.feed(line, matcher),
        since=since,
        lines=lines,
        follow=follow,
        kdtree_only=grep in ("shapes", "parity"),
        on_token=printer.use_token,
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


Matcher = Callable[[str, KdtreeLine | None, Judgement | None], bool]


def _matcher(grep: str | None) -> Matcher:
    """Which messages ``--grep`` shows: each message with its record (None: not a marked line) and the gate's
    judgement (None: not about parity)."""
    if grep is None:
        return lambda _msg, _rec, _judged: True
    if grep == "shapes":
        return lambda _msg, rec, _judged: isinstance(rec, ShapesLine)
    if grep == "parity":
        # Whatever the gate would judge: the lines it counts, and the ones it ignores (forged, or the marker
        # inside another message), so that a forgery is seen reading IGNORED.
        return lambda _msg, _rec, judged: judged is not None
    try:
        rx = re.compile(grep)
    except re.error as e:
        raise UsageError(f"--grep {grep!r} is not a valid regular expression: {e}") from None
    return lambda msg, _rec, _judged: bool(rx.search(msg))


class _LogPrinter:
    """Prints the journal entries ``feed`` is given; parity lines with the gate's verdict (``token``: the running
    invocation's, see ``use_token``)."""

    def __init__(self, h: HostConfig, as_json: bool, stream: bool, token: str | None = None, raw: bool = False) -> None:
        self.h, self.as_json, self.stream, self.raw = h, as_json, stream, raw
        self.judge = LineJudge(h, token)
        self.read = 0  # journal entries read
        self.matched = 0  # of those, shown
        self.parity: list[Judgement] = []
        self.parity_times: list[str] = []

    def use_token(self, token: str | None) -> None:
        """Judge by the token the running invocation was handed (read from the host before the first line)."""
        self.judge = LineJudge(self.h, token)

    def feed(self, raw: str, matcher: Matcher) -> None:
        try:
            doc = json.loads(raw)
        except ValueError:
            return
        self.read += 1
        msg = message_text(doc.get("MESSAGE", ""))  # null (left out by journalctl): judged, a FAIL
        stamp = doc.get("__REALTIME_TIMESTAMP")
        judged = self.judge.message(msg)
        rec = judged.line if judged is not None else parse_line(msg)
        if not matcher(msg, rec, judged):
            return
        self.matched += 1
        when = _fmt_time(stamp)
        if self.as_json:
            sys.stdout.write(json.dumps(common.to_jsonable(_log_json(when, msg, rec, judged)), default=str) + "\n")
            sys.stdout.flush()
        elif self.raw:
            self._journal_line(msg, stamp)
        elif judged is not None and not console.is_terminal:
            self._decoded_line(when, judged)
        elif judged is not None:
            self._parity(when, judged)
        elif isinstance(rec, ShapesLine):
            _print_shapes(when, rec)
        else:
            console.print(f"{when} {escaped(msg)}", highlight=False, markup=False, soft_wrap=True)

    def _decoded_line(self, when: str, judged: Judgement) -> None:
        """Piped: one line an entry, never wrapped: ``TIME HOST parity TP0 L30 rel=.. max_abs_diff=.. mean=..
        VERDICT`` and, unless it passed, why."""
        p = judged.line
        if p is None:  # the marker inside another message
            what = judged.raw.replace("\n", "\ufffd")[:300]
        elif judged.reason.startswith("malformed: "):
            what = f"{'TP' + str(p.rank) + ' ' if p.rank is not None else ''}{p.layer_label}"
        else:
            rank = f"TP{p.rank} " if p.rank is not None else ""
            what = f"{rank}L{p.layer} rel={fmt(p.rel)} max_abs_diff={fmt(p.max_abs_diff)} mean={fmt(p.mean)}"
        why = "" if judged.verdict is LineVerdict.PASS else f" ({judged.reason})"
        # Written past rich (never wrapped): the message's own text escaped here.
        console.file.write(escaped(f"{when} {self.h.name} parity {what} {judged.verdict}{why}") + "\n")
        if self.stream:
            console.file.flush()

    def _journal_line(self, msg: str, stamp: Any) -> None:
        """--raw: the entry as `journalctl -o short-iso` prints it, so `opsctl parity check -` reads it as the
        journal itself."""
        # A newline (never in a stdout line; possible from another writer) would make a second line out of the
        # message's middle: U+FFFD keeps it one line, and a marked message with it stays malformed.
        one_line = msg.replace("\n", "\ufffd")
        # Escaped like every view (an ESC or U+202E would reach the terminal); the token and the marker keep their
        # characters, so the parity check of this text still finds them.
        console.file.write(f"{_iso_time(stamp)} {self.h.name} {self.h.unit}: {escaped(one_line)}\n")
        if self.stream:
            console.file.flush()

    def _parity(self, when: str, judged: Judgement) -> None:
        """Following: one line at once; otherwise a row of the table printed at the end."""
        if not self.stream:
            self.parity.append(judged)
            self.parity_times.append(when)
            return
        p = judged.line
        if p is None:  # the marker inside another message: the message itself
            what = escape(escaped(judged.raw))
        else:
            rank = f"TP{p.rank} " if p.rank is not None else ""
            what = f"{rank}L{p.layer} max_abs_diff={fmt(p.max_abs_diff)} mean={fmt(p.mean)} rel={fmt(p.rel)}"
        v = judged.verdict
        console.print(f"{when} {what} [{verdict_style(v)}]{v}[/]", highlight=False)

    def flush(self) -> None:
        if self.parity:
            console.print(parity_table(self.parity, title="parity", times=self.parity_times))


def _print_shapes(when: str, rec: ShapesLine) -> None:
    d = rec.decode()
    rank = f"TP{rec.rank} " if rec.rank is not None else ""
    console.print(
        f"{when} {rank}[bold]shapes[/] " + escape(" ".join(f"{k}={v}" for k, v in rec.fields.items())),
        highlight=False,
        soft_wrap=True,
    )
    console.print(f"    {escape(d.text())}", style="cyan", highlight=False, soft_wrap=True)
    if d.warning:
        console.print(f"    {escape(d.warning)}", style="bold red", highlight=False, soft_wrap=True)


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


_PARITY_FIELDS = ("layer", "rank", "max_abs_diff", "mean", "rel", "extra")  # a parity line's, in --json


def _log_json(when: str, msg: str, rec: KdtreeLine | None, judged: Judgement | None) -> dict[str, Any]:
    out: dict[str, Any] = {"time": when, "message": msg}
    if judged is not None:
        out["kind"] = "parity"
        if isinstance(rec, ParityLine):
            out.update({key: getattr(rec, key) for key in _PARITY_FIELDS})
        out["verdict"] = judged.verdict
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
