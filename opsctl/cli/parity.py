"""``opsctl parity check FILE|-``: judge journal text offline, exactly as a deploy's gate would (same parser, same
``GateState``; see opsctl/gate/parity_check.py). Exit 0 on PASS, 31 otherwise, 2 for bad input."""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, BinaryIO

import typer
from rich.markup import escape

from ..errors import GateFailed, UsageError
from ..gate.decision import LineVerdict
from ..gate.lines import TOKEN_RE as _TOKEN_RE
from ..gate.parity_check import check_entries
from ..gate.parity_report import ParityCheck
from ..journal.reader import BLOCK_BYTES, InputFormat, JournalReader
from ..terminal import escaped
from . import common
from .parityview import verdict_style

if TYPE_CHECKING:
    from ..inventory import GateSettings

app = typer.Typer(
    help="Parity lines outside a deploy: check a journal offline, replay stored captures.", no_args_is_help=True
)


def _open(source: str) -> BinaryIO:
    if source == "-":
        return sys.stdin.buffer
    try:
        return Path(source).open("rb")
    except OSError as e:
        raise UsageError(f"{source}: cannot read: {e.strerror or e}") from None


def _finite(name: str, value: float | None) -> float | None:
    if value is not None and not math.isfinite(value):
        raise UsageError(f"{name} must be a finite number, not {value}")
    return value


def _settings(
    host: str | None, pass_rel: float | None, fail_rel: float | None, passes: int | None
) -> tuple[GateSettings, int | None]:
    """The gate settings (and TP size) a deploy to HOST would use, else the defaults; flags override either."""
    # Here, not at the top: the inventory's models (pydantic) are the slowest import, and --help needs none.
    from pydantic import ValidationError

    from ..inventory import GateSettings

    _finite("--pass-rel", pass_rel)
    _finite("--fail-rel", fail_rel)
    base, tp = GateSettings(), None
    if host is not None:
        h = common.inventory().host(host)
        base, tp = h.gate, h.service.tp
    options = {"pass_rel": "--pass-rel", "fail_rel": "--fail-rel", "consecutive_passes": "--passes"}
    update = {
        k: v
        for k, v in (("pass_rel", pass_rel), ("fail_rel", fail_rel), ("consecutive_passes", passes))
        if v is not None
    }
    try:
        settings = GateSettings.model_validate({**base.model_dump(), **update})
    except ValidationError as e:
        first = e.errors()[0]
        key = str(first["loc"][0]) if first["loc"] else ""
        name = options.get(key, "--pass-rel/--fail-rel" if not key else key)
        raise UsageError(f"{name}: {first['msg'].removeprefix('Value error, ')}") from None
    for key, name in options.items():
        if key != "consecutive_passes" and not math.isfinite(getattr(settings, key)):
            raise UsageError(f"{name} must be a finite number (from {'--host' if host else 'the defaults'})")
    return settings, tp


def _token(token: str | None) -> str | None:
    if token is None:
        return None
    if not _TOKEN_RE.fullmatch(token):
        raise UsageError(
            "--token must be the invocation's token as the backend prints it: 8 to 128 characters of A-Z a-z 0-9 _ - "
            f"(got {len(token)} characters{'' if token else ': an empty token checks nothing'})"
        )
    return token


MAX_TOKEN_FILE_BYTES = 64 * 1024  # state/parity.env is one line; read no more than this


def _token_from_file(path: str, source: str) -> str:
    """The token from a file (``state/parity.env``, ``KDTREE_PARITY_TOKEN=<token>``, or the bare token on its own
    line), ``-`` for stdin: never from the command line, where ``ps`` shows it. Nothing of the file's content is
    ever printed (it is a secret)."""
    from kdtree_backend.wire import PARITY_TOKEN_VAR

    if path == "-":
        if source == "-":
            raise UsageError("--token-file -: the journal is already on stdin; give the token file's path")
        data = sys.stdin.buffer.read(MAX_TOKEN_FILE_BYTES + 1)
        where = "--token-file - (stdin)"
    else:
        where = f"--token-file {escaped(path)}"
        try:
            with Path(path).open("rb") as f:
                data = f.read(MAX_TOKEN_FILE_BYTES + 1)
        except OSError as e:
            raise UsageError(f"{where}: cannot read: {e.strerror or e}") from None
    if len(data) > MAX_TOKEN_FILE_BYTES:
        raise UsageError(f"{where}: larger than {MAX_TOKEN_FILE_BYTES // 1024} KiB: not a token file")
    text = data.decode("utf-8", errors="replace")
    assigned = [
        value.strip().strip("'\"")
        for key, sep, value in (line.partition("=") for line in text.splitlines())
        if sep and key.strip() == PARITY_TOKEN_VAR
    ]
    words = text.split()
    found = assigned[-1] if assigned else (words[0] if len(words) == 1 and "=" not in words[0] else None)
    if found is None or not _TOKEN_RE.fullmatch(found):
        raise UsageError(
            f"{where}: holds no token ({len(data)} bytes; want a {PARITY_TOKEN_VAR}=<token> line, as in "
            "state/parity.env, or the token alone: 8 to 128 characters of A-Z a-z 0-9 _ -; content not shown)"
        )
    return found


def _print(check: ParityCheck, all_invocations: bool) -> None:
    if all_invocations and len(check.invocations) > 1:
        _print_invocations(check)
    _print_lines(check)
    _print_not_listed(check)
    _print_gate(check)


def _print_invocations(check: ParityCheck) -> None:
    """--all: each invocation found in the text, with its own verdict."""
    for inv in check.invocations:
        v = inv.state.verdict
        tok = f" token {escape(escaped(inv.token))}" if inv.token else ""
        common.out.print(
            f"invocation {inv.index} (lines {inv.first_line}-{inv.last_line}{tok}): "
            f"[{verdict_style(v)}]{v}[/] {escape(escaped(inv.state.reason))} "
            f"({inv.state.lines} counted, {inv.ignored} ignored)",
            soft_wrap=True,
        )


def _print_lines(check: ParityCheck) -> None:
    """The listed lines of the judged invocation, each with its verdict and why."""
    for c in check.lines:
        j = c.judgement
        where = f" {j.line.where}" if j.line is not None else ""
        late = " [dim](after the gate had decided)[/]" if j.after_decision else ""
        common.out.print(
            f"line {c.number:>5}{escape(where)}: [{verdict_style(j.verdict)}]{j.verdict}[/] {escape(escaped(j.reason))}{late}",
            soft_wrap=True,
        )


def _print_not_listed(check: ParityCheck) -> None:
    """What the listing leaves out: lines over the limit, lines after the decision, entries with no message."""
    out, inv = common.out, check.judged
    if inv.counted_unlisted:
        out.print(f"[dim]... {inv.counted_unlisted} more counted lines not listed[/]")
    listed_ignored = sum(1 for c in check.lines if c.judgement.verdict is LineVerdict.IGNORED)
    if inv.ignored > listed_ignored:
        out.print(f"[dim]... {inv.ignored - listed_ignored} more ignored lines not listed[/]")
    late = {k: v for k, v in inv.late.items() if v}
    if late:
        out.print(
            "[dim]after the gate had decided: "
            + ", ".join(f"{v} {k}" for k, v in late.items())
            + " (a deploy stops reading there)[/]"
        )
    if check.left_out:
        common.err.print(
            f"[yellow]{check.left_out} journal messages were left out by journalctl (JSON null for 4096 bytes or "
            "more, [N blob data] in text, without --all): each is judged a FAIL; rerun journalctl with --all (-a)[/]",
            soft_wrap=True,
        )


def _judged_which(check: ParityCheck) -> str:
    """Which part of the text the verdict is about."""
    n, inv = len(check.invocations), check.judged
    if check.token_given:
        return f"the whole text ({n} invocation(s) seen)"
    if n > 1:
        return f"invocation {inv.index} of {n} (the last; lines {inv.first_line}-{inv.last_line})"
    return "the one invocation seen"


def _print_gate(check: ParityCheck) -> None:
    """The aggregate verdict, with the rules it was reached by."""
    st, s = check.state, check.state.settings
    token = "checked (given)" if check.token_given else ("checked (the invocation's own)" if st.token else "none seen")
    common.out.print(
        f"gate: [{verdict_style(st.verdict)}]{st.verdict}[/] {escape(escaped(st.reason))} "
        f"(judged {_judged_which(check)}; {st.lines} parity lines counted, {check.judged.ignored} ignored; "
        f"pass rel <= {s.pass_rel:g}, fail rel >= {s.fail_rel:g}, {s.consecutive_passes} consecutive passes per "
        f"rank, {'TP ' + str(st.expected_ranks) if st.expected_ranks else 'ranks as seen'}, token {escape(token)})",
        soft_wrap=True,
    )


@app.command("check")
@common.bounded
def check(
    source: Annotated[
        str,
        typer.Argument(
            help="journalctl output (-o short, short-precise, short-iso[-precise], short-full, short-unix, "
            "short-monotonic, cat, json) or opsctl logs [--json] output; - for stdin."
        ),
    ],
    host: Annotated[
        str | None, typer.Option("--host", help="Use this inventory host's gate settings and TP size.")
    ] = None,
    pass_rel: Annotated[float | None, typer.Option("--pass-rel", help="rel <= this passes.")] = None,
    fail_rel: Annotated[float | None, typer.Option("--fail-rel", help="rel >= this fails.")] = None,
    passes: Annotated[int | None, typer.Option("--passes", help="Consecutive passes needed per rank.")] = None,
    tp: Annotated[
        int | None,
        typer.Option("--tp", min=1, help="TP ranks the unit runs: each must pass, a silent one is NODATA."),
    ] = None,
    token: Annotated[
        str | None,
        typer.Option(
            "--token",
            help="The invocation's token: only lines carrying it count, as in the deploy's gate. Without it the last "
            "invocation in the text is judged with its own token. Visible to other users in ps: prefer --token-file.",
        ),
    ] = None,
    token_file: Annotated[
        str | None,
        typer.Option(
            "--token-file",
            help="Read the token from this file: state/parity.env (KDTREE_PARITY_TOKEN=...) or the token alone; "
            "- for stdin (when the journal comes from a file).",
            show_default=False,
        ),
    ] = None,
    all_invocations: Annotated[
        bool, typer.Option("--all", help="Also show the verdict of every invocation found in the text.")
    ] = False,
    json_out: common.JsonOption = False,
) -> None:
    """Judge \\[kdtree] parity lines from a journal as the deploy's gate would; exit 0 only on PASS.

    journalctl -u sglang-k26-ddtree -o short-iso --all | opsctl parity check - --tp 8 --token-file /root/kdtree-engine/state/parity.env
    """
    if token is not None and token_file is not None:
        raise UsageError("--token and --token-file: give one of them")
    token = _token(token) if token_file is None else _token_from_file(token_file, source)
    if all_invocations and token is not None:
        raise UsageError(
            "--all lists the invocations found without a token; with --token(-file) the whole text is judged"
        )
    settings, host_tp = _settings(host, pass_rel, fail_rel, passes)
    reader = JournalReader("stdin" if source == "-" else source)
    stream = _open(source)
    try:
        blocks = iter(lambda: stream.read(BLOCK_BYTES), b"")
        result = check_entries(reader.read(blocks), settings, tp=tp or host_tp, token=token, reader=reader)
    finally:
        if stream is not sys.stdin.buffer:
            stream.close()
    result.input_lines, result.unreadable, result.left_out = reader.lines, reader.unreadable, reader.left_out
    result.input_format = str(reader.format or InputFormat.TEXT)
    if json_out:
        common.emit_json(result.to_json(all_invocations=all_invocations))
    else:
        _print(result, all_invocations)
    if not result.verdict.ok:
        raise typer.Exit(code=GateFailed.exit_code)


@app.command("replay")
@common.bounded
def replay(
    host: common.HostArg = None,
    release: Annotated[
        str, typer.Option("--release", help="Release id on the host (opsctl releases HOST), or 'current'.")
    ] = "current",
    json_out: common.JsonOption = False,
) -> None:
    """Replay the captures stored on HOST (opsctl capture) with release R there, without deploying; judge the lines
    with the gate's rules. Exit 0 only on PASS (docs/capture.md)."""
    from .capture import parity_replay

    parity_replay(host, release, json_out)
