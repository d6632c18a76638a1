"""Taking a capture on a host: the request file the backend reads (``kdtree_backend.capture_format``), whether a
capture may be armed at all, arming it on the host's clock, waiting until every TP rank has finished, disarming,
and what to tell the operator when it stored nothing (``opsctl capture``'s one SSH session: :func:`take_capture`).

    <root>/state/capture/request.json     written here (0600), read by every TP rank of the service
    <root>/state/capture/<id>/...         written by the service (0700 dirs, 0600 files)

The request document, the refusal and the outcome's wording are pure; :func:`arm`, :func:`disarm` and
:func:`wait_for` take a connected remote.
"""

from __future__ import annotations

import datetime as dt
import json
import secrets
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from kdtree_backend.wire import CAPTURE_ID_RE

from ..errors import UsageError
from ..host import releaseroot
from ..inventory import HostConfig
from ..ssh.remote import Remote
from . import capturedir
from .capturedir import REQUEST_FILE, check_capture_id
from .listing import CaptureFailed, CaptureSet, capture_dir, read_listing
from .pruning import PruneLimits, prune, prune_plan

FORMAT = "kdtree-capture/1"
MAX_STEPS = 64
DEFAULT_LAYERS = (0, 30, 60)
DEFAULT_STEPS = 1
DEFAULT_MAX_MB = 1024  # for the whole capture; each TP rank gets its share
DEFAULT_TTL_S = 600  # an armed request the service has not finished by then is void

Progress = Callable[[CaptureSet | None, float], None]
"""Told the capture as it stands (None before anything is stored) and the seconds since arming, on every poll."""


def parse_layers(raw: str) -> tuple[int, ...]:
    """``0,30,60`` -> (0, 30, 60); sorted, unique, non-negative."""
    try:
        layers = {int(x) for x in raw.split(",") if x.strip()}
    except ValueError:
        raise UsageError(f"--layers wants comma-separated layer ids like 0,30,60, got {raw!r}") from None
    if not layers or min(layers) < 0:
        raise UsageError(f"--layers wants non-negative layer ids like 0,30,60, got {raw!r}")
    return tuple(sorted(layers))


def new_capture_id(now: dt.datetime | None = None, suffix: str | None = None) -> str:
    """``c<UTC stamp>Z-<6 hex>``: sorts by time, and the backend accepts nothing else."""
    now = now or dt.datetime.now(dt.UTC)
    ident = f"c{now.astimezone(dt.UTC):%Y%m%dT%H%M%SZ}-{suffix or secrets.token_hex(3)}"
    if not CAPTURE_ID_RE.fullmatch(ident):
        raise ValueError(f"bad capture id {ident!r}")
    return ident


def request_doc(
    *,
    capture_id: str,
    layers: Iterable[int],
    steps: int,
    max_mb: float,
    tp: int,
    host_now: float,
    ttl_s: float = DEFAULT_TTL_S,
    by: str = "",
) -> dict[str, Any]:
    """The request file's JSON (kdtree_backend.capture.parse_request reads it). ``max_mb`` is the whole
    capture's budget, split evenly over the host's ``tp`` ranks (each rank bounds its own share)."""
    check_capture_id(capture_id)
    if not 1 <= steps <= MAX_STEPS:
        raise UsageError(f"--steps must be 1..{MAX_STEPS}, got {steps}")
    if not max_mb > 0:
        raise UsageError(f"--max-mb must be > 0, got {max_mb:g}")
    if not ttl_s > 0:
        raise UsageError(f"--ttl must be > 0 seconds, got {ttl_s:g}")
    return {
        "format": FORMAT,
        "id": capture_id,
        "layers": sorted(set(layers)),
        "steps": steps,
        "max_bytes": max(1, int(max_mb * 1024 * 1024 / max(tp, 1))),
        "expires_at": float(host_now) + ttl_s,
        "requested_at": float(host_now),
        "requested_by": by[:200],
    }


def arm(
    r: Remote, host: HostConfig, *, layers: Iterable[int], steps: int, max_mb: float, ttl_s: float, by: str
) -> dict[str, Any]:
    """Write the request file (its expiry on the host's clock). Returns the request written."""
    now_res = r.run(capturedir.HOST_CLOCK_COMMAND, timeout=60)
    try:
        host_now = float(now_res.stdout.strip())
    except ValueError:
        raise CaptureFailed(f"{host.name}: `date +%s` said {now_res.stdout.strip()!r}") from None
    doc = request_doc(
        capture_id=new_capture_id(),
        layers=layers,
        steps=steps,
        max_mb=max_mb,
        tp=host.service.tp,
        host_now=host_now,
        ttl_s=ttl_s,
        by=by,
    )
    directory = capture_dir(host)
    r.run(capturedir.prepare_dir_command(directory), timeout=60)
    r.write_file(f"{directory}/{REQUEST_FILE}", json.dumps(doc, indent=1) + "\n", mode=0o600)
    return doc


def disarm(r: Remote, host: HostConfig, capture_id: str) -> None:
    """Remove the request file if it still names ``capture_id`` (a newer request is left alone)."""
    r.run(capturedir.disarm_command(capture_dir(host), capture_id), timeout=60)


def arm_refusal(host: HostConfig, *, managed: bool, current: str | None, active_state: str) -> str | None:
    """Why a capture must not be armed on ``host`` (None: it may). Only a running service of a release opsctl
    deployed takes a request; armed anywhere else, it would lie there until the first deploy's service took it
    by surprise. Pure."""
    if not managed or current is None:
        return (
            f"{host.name}: no release deployed by opsctl (nothing under {host.root}/current): no service would "
            f"take the capture; deploy first (`opsctl deploy {host.name}`)"
        )
    if active_state != "active":
        return (
            f"{host.name}: {host.unit} is {active_state or 'unknown'}, not running: nothing would take the capture "
            f"until its next start; start it (`opsctl service {host.name} start`) or deploy, then capture"
        )
    return None


def wait_for(
    r: Remote,
    host: HostConfig,
    capture_id: str,
    *,
    timeout_s: float,
    poll_s: float = 1.0,
    progress: Progress | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> CaptureSet:
    """Poll until every TP rank (``service.tp``) has finished the capture; :class:`CaptureFailed` on timeout."""
    start = clock()
    while True:
        listing = read_listing(r, host)
        current = listing.get(capture_id)
        elapsed = clock() - start
        if progress is not None:
            progress(current, elapsed)
        if current is not None and current.complete(host.service.tp) and not current.partial:
            return current
        if elapsed >= timeout_s:
            got = (
                f"{len(current.calls)} call(s) from rank(s) {sorted(current.done) or 'none'} finished"
                if current
                else "nothing"
            )
            raise CaptureFailed(
                f"{host.name}: capture {capture_id} not finished by every TP rank within {timeout_s:g}s ({got}). "
                "The service captures on its next verify steps: is it serving DDTree traffic? The request stays "
                f"armed until it expires; look again with `opsctl captures {host.name}`"
            )
        sleep(poll_s)


def outcome_problem(capture: CaptureSet, tp: int) -> str | None:
    """Why a finished capture is of no use (None when it stored calls), in words an operator can act on."""
    if capture.calls:
        return None
    reasons = sorted({d.reason for d in capture.done.values()})
    hints = []
    for d in capture.done.values():
        if d.reason == "graph_capture_off":
            hints.append(
                "the service runs verify inside CUDA graphs with capture.in_graphs false (deploy/kdtree.json): set it "
                "true and restart to capture there (docs/capture.md)"
            )
        elif d.reason == "layers_not_in_graph":
            hints.append(
                "under CUDA graphs only the layers the graphs were captured with (the parity layers) can be captured: "
                "pick --layers among them (docs/capture.md)"
            )
        elif d.reason == "max_bytes" and d.needed:
            hints.append(
                f"one call needs {d.needed / 2**20:.1f} MB per rank: raise --max-mb above {d.needed * tp / 2**20:.0f}"
            )
        elif d.reason == "steps":
            hints.append("no verify call of the requested layers was seen: check --layers against the model")
        elif d.reason == "error":
            hints.append(f"the service reported: {d.error}")
        elif d.reason == "expired":
            hints.append("the request expired before a verify step came")
    return f"capture {capture.id} stored nothing ({', '.join(reasons)}): " + "; ".join(dict.fromkeys(hints))


@dataclass(frozen=True)
class CaptureRun:
    pruned: list[tuple[str, str]]  # (capture id, why) removed before arming
    request: dict[str, Any]
    result: CaptureSet
    elapsed_s: float  # from arming to every rank finished


def take_capture(
    host: HostConfig,
    *,
    layers: Iterable[int],
    steps: int,
    max_mb: float,
    ttl_s: float,
    timeout_s: float,
    by: str,
    on_pruned: Callable[[str, str], None],
    on_armed: Callable[[dict[str, Any]], Progress],
) -> CaptureRun:
    """Prune old captures, arm a new one, wait for every TP rank, disarm. ``on_armed`` is told the request and
    returns the progress callback for the wait. UsageError when a capture is armed already; CaptureFailed when
    the ranks do not finish within ``timeout_s``."""
    from ..ssh import connect

    with connect(host) as r:
        snap = releaseroot.read_snapshot(r, host.root, host.unit)
        refusal = arm_refusal(host, managed=snap.is_managed, current=snap.current, active_state=snap.unit.active_state)
        if refusal:
            raise UsageError(refusal)
        before = read_listing(r, host)
        if before.armed_id:
            raise UsageError(
                f"{host.name}: capture {before.armed_id} is armed already (expires on its own); wait for it, "
                f"or remove it with `opsctl captures {host.name} --disarm`"
            )
        pruned = prune_plan(before, PruneLimits())
        prune(r, host, [ident for ident, _ in pruned])
        for ident, why in pruned:
            on_pruned(ident, why)
        started = time.monotonic()
        request = arm(r, host, layers=layers, steps=steps, max_mb=max_mb, ttl_s=ttl_s, by=by)
        result = wait_for(r, host, request["id"], timeout_s=timeout_s, progress=on_armed(request))
        disarm(r, host, request["id"])
    return CaptureRun(pruned, request, result, time.monotonic() - started)
