"""``opsctl parity check FILE|-``: judge journal text offline, exactly as a deploy's gate would (same parser, same
``GateState``; see opsctl/parity_check.py). Exit 0 on PASS, 31 otherwise, 2 for bad input."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from ..errors import GateFailed, UsageError
from ..gate import LineVerdict
from ..inventory import GateSettings
from ..parity_check import ParityCheck, check_journal
from . import common

STYLE = {"PASS": "bold green", "FAIL": "bold red", "INCONCLUSIVE": "yellow", "IGNORED": "dim", "NODATA": "red"}

app = typer.Typer(
    help="Parity lines outside a deploy: check a journal offline, replay stored captures.", no_args_is_help=True
)


def _read(source: str) -> list[str]:
    if source == "-":
        return sys.stdin.read().splitlines()
    try:
        return Path(source).read_text(errors="replace").splitlines()
    except OSError as e:
        raise UsageError(f"{source}: cannot read: {e.strerror or e}") from None


def _settings(
    host: str | None, pass_rel: float | None, fail_rel: float | None, passes: int | None
) -> tuple[GateSettings, int | None]:
    """The gate settings (and TP size) a deploy to HOST would use, else the defaults; flags override either."""
    base, tp = GateSettings(), None
    if host is not None:
        h = common.inventory().host(host)
        base, tp = h.gate, h.service.tp
    update = {
        k: v
        for k, v in (("pass_rel", pass_rel), ("fail_rel", fail_rel), ("consecutive_passes", passes))
        if v is not None
    }
    try:
        return GateSettings.model_validate({**base.model_dump(), **update}), tp
    except ValueError as e:
        raise UsageError(f"gate settings: {e}") from None


def _print(check: ParityCheck) -> None:
    out = common.out
    for c in check.lines:
        j = c.judgement
        v = str(j.verdict)
        where = f" {j.line.where}" if j.line is not None else ""
        late = " [dim](after the gate had decided)[/]" if j.after_decision else ""
        out.print(f"line {c.number:>5}{where}: [{STYLE.get(v, '')}]{v}[/] {escape(j.reason)}{late}", soft_wrap=True)
    st = check.state
    ignored = st.counts[LineVerdict.IGNORED]
    s = st.settings
    out.print(
        f"gate: [{STYLE.get(str(st.verdict), '')}]{st.verdict}[/] {escape(st.reason)} "
        f"({st.lines} parity lines counted, {ignored} ignored; pass rel <= {s.pass_rel:g}, fail rel >= {s.fail_rel:g}, "
        f"{s.consecutive_passes} consecutive passes per rank, "
        f"{'TP ' + str(st.expected_ranks) if st.expected_ranks else 'ranks as seen'}, "
        f"token {'checked' if st.token else 'not checked'})",
        soft_wrap=True,
    )


@app.command("check")
@common.bounded
def check(
    source: Annotated[str, typer.Argument(help="Journal text to read (any journalctl -o format), or - for stdin.")],
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
            "--token", help="The invocation's token (state/parity.env); without it everything but the token is checked."
        ),
    ] = None,
    json_out: common.JsonOption = False,
) -> None:
    """Judge [kdtree] parity lines from a journal as the deploy's gate would; exit 0 only on PASS.

    journalctl -u sglang-k26-ddtree -o short-iso | opsctl parity check -
    """
    settings, host_tp = _settings(host, pass_rel, fail_rel, passes)
    result = check_journal(_read(source), settings, tp=tp or host_tp, token=token)
    if json_out:
        common.emit_json(result.to_json())
    else:
        _print(result)
    if not result.state.verdict.ok:
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
