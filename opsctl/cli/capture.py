"""``opsctl capture HOST``, ``opsctl captures HOST`` and the body of ``opsctl parity replay HOST`` (docs/capture.md).

Thin over opsctl/captures/ (arming, listing, pruning, capture_replay): options, progress, rendering, exit codes.
"""

from __future__ import annotations

import getpass
import socket
import time
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from ..captures import arming, capture_replay, pruning
from ..captures.listing import CaptureFailed, CaptureSet, Listing, RequestState, capture_dir, duration_text
from ..errors import GateFailed
from ..gate.decision import Verdict
from ..host.releaseroot import new_parity_token
from ..inventory import HostConfig
from . import common
from .parityview import verdict_style


def _mb(n: float) -> str:
    return f"{n / 2**20:.1f} MB"


def _who() -> str:
    try:
        return f"{getpass.getuser()}@{socket.gethostname()}"
    except (OSError, KeyError):
        return "?"


def _limits(keep: int | None, keep_mb: float | None, max_age_days: float | None) -> pruning.PruneLimits:
    base = pruning.PruneLimits()
    return pruning.PruneLimits(
        keep=base.keep if keep is None else keep,
        max_bytes=base.max_bytes if keep_mb is None else int(keep_mb * 2**20),
        max_age_s=base.max_age_s if max_age_days is None else max_age_days * 86400,
    )


class _Progress:
    """One stderr line whenever the stored calls or finished ranks change (and every 10 s while waiting)."""

    def __init__(self, host: HostConfig, capture_id: str) -> None:
        self.host, self.id = host, capture_id
        self.last: tuple[int, int, int] | None = None
        self.last_at = 0.0

    def __call__(self, current: CaptureSet | None, elapsed: float) -> None:
        calls = len(current.calls) if current else 0
        done = len(current.done) if current else 0
        size = current.bytes if current else 0
        key = (calls, done, size)
        if key == self.last and elapsed - self.last_at < 10:
            return
        self.last, self.last_at = key, elapsed
        common.err.print(
            f"[dim]capture {self.id}: {calls} call(s) stored, {_mb(size)}, "
            f"{done}/{self.host.service.tp} TP rank(s) finished [{elapsed:.0f}s][/]",
            soft_wrap=True,
        )


def _calls_table(capture: CaptureSet) -> Table:
    table = Table(title=f"capture {capture.id}", title_justify="left")
    for col in ("tp", "layer", "step", "bs", "size", "release"):
        table.add_column(col)
    for c in capture.calls:
        table.add_row(str(c.tp), str(c.layer), str(c.step), str(c.bs or "-"), _mb(c.bytes), escape(c.release))
    return table


app = typer.Typer()


@app.command()
@common.bounded
def capture(
    host: common.HostArg = None,
    layers: Annotated[str, typer.Option("--layers", help="Layer ids to capture, e.g. 0,30,60.")] = ",".join(
        map(str, arming.DEFAULT_LAYERS)
    ),
    steps: Annotated[
        int, typer.Option("--steps", min=1, max=arming.MAX_STEPS, help="Verify steps to capture per TP rank.")
    ] = arming.DEFAULT_STEPS,
    max_mb: Annotated[
        float,
        typer.Option(
            "--max-mb", parser=common.finite_float, help="Most MB the capture may store (all TP ranks together)."
        ),
    ] = arming.DEFAULT_MAX_MB,
    ttl: Annotated[
        float,
        typer.Option(
            "--ttl", parser=common.finite_float, help="Seconds the request stays armed on the host (its clock)."
        ),
    ] = arming.DEFAULT_TTL_S,
    timeout: Annotated[
        float | None,
        typer.Option(
            "--timeout", parser=common.finite_float, help="Seconds to wait for every TP rank (default: --ttl)."
        ),
    ] = None,
    inventory: common.InventoryOption = None,
    json_out: common.JsonOption = False,
) -> None:
    """Arm a capture of the next verify calls on HOST, wait until every TP rank has stored them, report.

    The files stay on the host (root only, 0600) and expire. `opsctl captures HOST` lists them;
    `opsctl parity replay HOST --release R` replays them."""
    layer_ids = arming.parse_layers(layers)
    hc = common.pick_host(common.inventory(inventory), host, "capture")

    def pruned_one(ident: str, why: str) -> None:
        common.err.print(f"[dim]pruned capture {ident} ({escape(why)})[/]", soft_wrap=True)

    def armed(request: dict[str, Any]) -> arming.Progress:
        common.err.print(
            f"[dim]armed capture {request['id']} on {hc.name}: layers {list(layer_ids)}, {steps} step(s), "
            f"<= {max_mb:g} MB ({_mb(request['max_bytes'])} per TP rank), expires in {ttl:g}s[/]",
            soft_wrap=True,
        )
        return _Progress(hc, request["id"])

    run = arming.take_capture(
        hc,
        layers=layer_ids,
        steps=steps,
        max_mb=max_mb,
        ttl_s=ttl,
        timeout_s=ttl if timeout is None else timeout,
        by=_who(),
        on_pruned=pruned_one,
        on_armed=armed,
    )
    result, pruned, elapsed = run.result, run.pruned, run.elapsed_s
    problem = arming.outcome_problem(result, hc.service.tp)
    if json_out:
        common.emit_json(
            {
                "host": hc.name,
                "directory": f"{capture_dir(hc)}/{result.id}",
                "elapsed_s": round(elapsed, 2),
                "pruned": [{"id": i, "why": w} for i, w in pruned],
                **result.to_json(time.time()),
                "problem": problem,
            }
        )
    else:
        common.out.print(_calls_table(result))
        reasons = ", ".join(f"TP{d.tp} {d.reason}" for d in sorted(result.done.values(), key=lambda d: d.tp))
        common.out.print(
            f"{hc.name}: capture {result.id}: {len(result.calls)} call(s), {_mb(result.bytes)} in "
            f"{capture_dir(hc)}/{result.id} (release {', '.join(result.releases) or '?'}; {reasons}) "
            f"[{elapsed:.1f}s]",
            soft_wrap=True,
        )
    if problem and json_out:
        raise typer.Exit(CaptureFailed.exit_code)  # the JSON above says why
    if problem:
        raise CaptureFailed(f"{hc.name}: {problem}")


@app.command()
@common.bounded
def captures(
    host: common.HostArg = None,
    prune: Annotated[
        bool, typer.Option("--prune", help="Remove old captures (see --keep, --keep-mb, --max-age-days).")
    ] = False,
    keep: Annotated[
        int | None, typer.Option("--keep", min=0, help=f"Captures to keep (default {pruning.DEFAULT_KEEP}).")
    ] = None,
    keep_mb: Annotated[
        float | None,
        typer.Option(
            "--keep-mb", parser=common.finite(0), help=f"MB to keep in all (default {pruning.DEFAULT_KEEP_MB})."
        ),
    ] = None,
    max_age_days: Annotated[
        float | None,
        typer.Option(
            "--max-age-days",
            parser=common.finite(0),
            help=f"Older captures go (default {pruning.DEFAULT_MAX_AGE_S // 86400}).",
        ),
    ] = None,
    disarm: Annotated[
        bool, typer.Option("--disarm", help="Remove the capture request file (armed or not) from HOST.")
    ] = False,
    inventory: common.InventoryOption = None,
    json_out: common.JsonOption = False,
) -> None:
    """List the captures stored on HOST (age, release, size) and its capture request, armed or left behind; with
    --prune remove old ones (and an expired request), with --disarm the request."""
    hc = common.pick_host(common.inventory(inventory), host, "captures")
    limits = _limits(keep, keep_mb, max_age_days)
    run = pruning.list_captures(hc, limits if prune else None, disarm=disarm)
    listing, removed = run.listing, run.removed_request
    gone = {ident for ident, _ in run.pruned}
    remaining = [s for s in listing.sets if s.id not in gone]
    if json_out:
        common.emit_json(_captures_json(hc, run, remaining))
        return
    for ident, why in run.pruned:
        common.out.print(f"pruned {ident} ({escape(why)})", soft_wrap=True)
    _print_request(hc, listing.request_state, removed)
    if not remaining:
        common.out.print(f"{hc.name}: no captures in {listing.directory or capture_dir(hc)}")
        return
    common.out.print(_captures_table(hc, listing, remaining, removed))


def _captures_json(hc: HostConfig, run: pruning.ListRun, remaining: list[CaptureSet]) -> dict[str, Any]:
    """``captures --json``: what is left on the host, what was pruned, and the request file (removed or not)."""
    listing, removed = run.listing, run.removed_request
    request = listing.request_state
    return {
        "host": hc.name,
        "directory": listing.directory,
        "armed": None if removed else listing.armed_id,
        "request": None if request is None else {**request.to_json(), "removed": removed is not None},
        "captures": [s.to_json(listing.now) for s in remaining],
        "pruned": [{"id": i, "why": w} for i, w in run.pruned],
    }


def _print_request(hc: HostConfig, request: RequestState | None, removed: RequestState | None) -> None:
    """The request file's line: removed now, or still there with the option that removes it."""
    if request is None:
        return
    if removed is not None:
        common.out.print(f"{hc.name}: removed the request file: {escape(request.text())}", soft_wrap=True)
        return
    hint = "--disarm removes it" if request.state == "armed" else "--prune removes it"
    style = "yellow" if request.state == "armed" else "red"
    common.out.print(f"[{style}]{hc.name}: {escape(request.text())}[/] ({hint})", soft_wrap=True)


def _capture_state(s: CaptureSet, listing: Listing, removed: RequestState | None, tp: int) -> str:
    """``armed`` (its request is still there), ``complete`` (every TP rank finished) or ``incomplete``, and
    how many of its files are still being written."""
    if s.id == listing.armed_id and removed is None:
        state = "armed"
    else:
        state = "complete" if s.complete(tp) else "incomplete"
    if s.partial:
        state += f" ({s.partial} writing)"
    return state


def _captures_table(
    hc: HostConfig, listing: Listing, remaining: list[CaptureSet], removed: RequestState | None
) -> Table:
    """The captures left on the host, newest first."""
    table = Table(title=f"{hc.name}: {listing.directory}", title_justify="left")
    for col in ("capture", "age", "release", "TP ranks done", "calls", "layers", "size", "state"):
        table.add_column(col)
    for s in sorted(remaining, key=lambda s: s.created, reverse=True):
        table.add_row(
            s.id,
            duration_text(s.age_s(listing.now)),
            escape(", ".join(s.releases) or "?"),
            f"{len(s.done)}/{hc.service.tp}",
            str(len(s.calls)),
            ",".join(str(x) for x in sorted({c.layer for c in s.calls})) or "-",
            _mb(s.bytes),
            _capture_state(s, listing, removed, hc.service.tp),
        )
    return table


def parity_replay(host_name: str | None, release: str, json_out: bool, inventory: Any = None) -> None:
    """``opsctl parity replay HOST --release R``: replay every stored capture with release R on the host (no
    deploy, nothing switched) and judge the lines with the gate's rules. Exit 0 on PASS, 31 otherwise."""
    host = common.pick_host(common.inventory(inventory), host_name, "parity replay")
    token = new_parity_token()
    run = capture_replay.replay_release(host, release, token)
    release_id, result, elapsed = run.release, run.judgement, run.elapsed_s
    if json_out:
        common.emit_json({"host": host.name, "release": release_id, "elapsed_s": round(elapsed, 2), **result.to_json()})
    else:
        for j in result.judgements:
            v = str(j.verdict)
            where = j.line.where if j.line else ""
            capture_id = j.line.extra.get("capture", "") if j.line else ""
            vs = j.line.extra.get("vs_running", "?") if j.line else "?"
            common.out.print(
                f"[{verdict_style(v)}]{v}[/] {where} {escape(capture_id)}: {escape(j.reason)} (vs running release {vs})",
                soft_wrap=True,
            )
        for line in run.stderr.split("\n"):  # a line ends at \n only, as the judgement reads it
            if "skipped:" in line:
                common.err.print(f"[red]{escape(line)}[/]", soft_wrap=True)
        v = str(result.verdict)
        common.out.print(
            f"{host.name}: parity replay of {release_id} -> [{verdict_style(v)}]{v}[/] ({escape(result.reason)}) "
            f"[{elapsed:.1f}s]",
            soft_wrap=True,
        )
    if result.verdict is not Verdict.PASS:
        if json_out:  # the JSON above has the verdict and the reason
            raise typer.Exit(CaptureFailed.exit_code if result.verdict is Verdict.ERROR else GateFailed.exit_code)
        if result.verdict is Verdict.ERROR:
            raise CaptureFailed(f"{host.name}: {result.reason}")
        raise GateFailed(f"{host.name}: parity replay of {release_id} {result.verdict}: {result.reason}")
