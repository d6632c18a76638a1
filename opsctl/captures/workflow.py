"""Captures of real verify calls on a host (docs/capture.md): arm, wait, list, prune, and the capture replay.

The backend (``kdtree_backend.capture``) does the capturing; opsctl only writes its request file, reads what it
stored, removes old captures and runs ``python -m kdtree_backend.replay --captures`` with a chosen release:

    <root>/state/capture/request.json     written here (0600), read by every TP rank of the service
    <root>/state/capture/<id>/...         written by the service (0700 dirs, 0600 files); removed by prune

Pure parts (request documents, listing parser, prune plan, the replay command line and its judgement) are
separate from the SSH calls (:func:`arm`, :func:`read_listing`, :func:`wait_for`, :func:`prune`), which take a
connected remote (``opsctl.ssh.client.connect(host)``).

Deploy integration: :func:`replay_command` is the remote command line of the capture replay for a release
directory, :func:`judge_replay` judges its output with the gate's parser and rules.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import secrets
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import OpsError, UsageError
from ..gate.decision import GateState, Judgement, LineVerdict, Verdict, judge
from ..host import releaseroot as host_layout
from ..host import releaseroot as hoststate
from ..host.replay import ReleaseCommand, capture_replay_command
from ..inventory import HostConfig
from ..release import ADOPTED_ID_RE
from ..release import ID_RE as RELEASE_ID_RE
from ..ssh.remote import Remote
from . import capturedir as host_captures

# The commands' home is opsctl.captures.capturedir and opsctl.host.replay; these names stay importable from here.
from .capturedir import ID_RE, REQUEST_FILE, check_capture_id

FORMAT = "kdtree-capture/1"
SUMMARY_RE = re.compile(r"^kdtree-replay: captures=(\d+) damaged=(\d+)\b")
MAX_STEPS = 64
DEFAULT_LAYERS = (0, 30, 60)
DEFAULT_STEPS = 1
DEFAULT_MAX_MB = 1024  # for the whole capture; each TP rank gets its share
DEFAULT_TTL_S = 600  # an armed request the service has not finished by then is void
DEFAULT_KEEP = 10
DEFAULT_KEEP_MB = 8192
DEFAULT_MAX_AGE_S = 7 * 86400  # captured activations derive from users' prompts: they expire
EXIT_REPLAY_FAILED = 3  # kdtree_backend.replay_captures: a line over the threshold, or a damaged capture
REPLAY_TIMEOUT_S = 900.0


class CaptureFailed(OpsError):
    """A capture that stored nothing usable, or did not finish in time; the message says why and what to do."""

    exit_code = 1


def capture_dir(host: HostConfig) -> str:
    return host_captures.capture_dir(host.root)


# ---------------------------------------------------------------------------------------------- the request


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
    now = now or dt.datetime.now(dt.UTC)
    ident = f"c{now.astimezone(dt.UTC):%Y%m%dT%H%M%SZ}-{suffix or secrets.token_hex(3)}"
    if not ID_RE.fullmatch(ident):
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


# ---------------------------------------------------------------------------------------------- listing


@dataclass(frozen=True)
class CallInfo:
    name: str
    tp: int
    layer: int
    step: int
    bytes: int
    release: str
    captured_at: float
    bs: int | None = None


@dataclass(frozen=True)
class RankDone:
    tp: int
    calls: int
    bytes: int
    steps: int
    reason: str
    release: str
    finished_at: float
    needed: int | None = None
    error: str | None = None


@dataclass
class CaptureSet:
    id: str
    mtime: float
    bytes: int
    calls: list[CallInfo] = field(default_factory=list)
    done: dict[int, RankDone] = field(default_factory=dict)
    partial: int = 0

    @property
    def created(self) -> float:
        """When it was taken: the capture id's UTC timestamp (the directory's mtime when unparsable)."""
        try:
            return dt.datetime.strptime(self.id[1:16], "%Y%m%dT%H%M%S").replace(tzinfo=dt.UTC).timestamp()
        except ValueError:
            return self.mtime

    @property
    def releases(self) -> list[str]:
        return sorted({c.release for c in self.calls} | {d.release for d in self.done.values()})

    def age_s(self, now: float) -> float:
        return max(0.0, now - self.created)

    def complete(self, ranks: int) -> bool:
        return all(r in self.done for r in range(ranks))

    def to_json(self, now: float) -> dict[str, Any]:
        return {
            "id": self.id,
            "age_s": round(self.age_s(now), 1),
            "releases": self.releases,
            "bytes": self.bytes,
            "calls": len(self.calls),
            "ranks_done": sorted(self.done),
            "partial": self.partial,
            "done": [vars(d) for d in self.done.values()],
            "layers": sorted({c.layer for c in self.calls}),
        }


@dataclass
class Listing:
    now: float  # the host's clock
    directory: str
    request: dict[str, Any] | None
    sets: list[CaptureSet]

    def get(self, capture_id: str) -> CaptureSet | None:
        return next((s for s in self.sets if s.id == capture_id), None)

    @property
    def armed_id(self) -> str | None:
        """The id of the request file while it is still armed (not expired)."""
        req = self.request
        if not isinstance(req, dict) or not isinstance(req.get("id"), str):
            return None
        expires = req.get("expires_at")
        if isinstance(expires, int | float) and expires <= self.now:
            return None
        return str(req["id"])

    @property
    def request_state(self) -> RequestState | None:
        """The request file, whatever it holds (armed, expired, or unreadable): None only when there is none."""
        req = self.request
        if req is None:
            return None
        ident = req.get("id") if isinstance(req.get("id"), str) else None
        expires = req.get("expires_at")
        remaining = float(expires) - self.now if isinstance(expires, int | float) else None
        state = "armed" if self.armed_id else ("expired" if ident and remaining is not None else "unreadable")
        return RequestState(id=ident, state=state, expires_in_s=remaining)


@dataclass(frozen=True)
class RequestState:
    """The request file as every view shows it: ``armed`` (the service takes it on its next verify steps),
    ``expired`` (left behind; ``captures --prune`` removes it) or ``unreadable``."""

    id: str | None
    state: str
    expires_in_s: float | None

    def text(self) -> str:
        if self.state == "armed":
            return f"capture {self.id} is armed (expires in {_duration(self.expires_in_s or 0)})"
        if self.state == "expired":
            return f"a capture request {self.id} is left behind, expired {_duration(-(self.expires_in_s or 0))} ago"
        return "an unreadable capture request file is left behind"

    def to_json(self) -> dict[str, Any]:
        remaining = None if self.expires_in_s is None else round(self.expires_in_s, 1)
        return {"id": self.id, "state": self.state, "expires_in_s": remaining}


def _num(doc: Mapping[str, Any], key: str, default: float = 0) -> float:
    value = doc.get(key, default)
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else float(default)


def parse_listing(text: str) -> Listing:
    """The listing script's JSON -> :class:`Listing`. Garbled entries are skipped; garbled JSON is an error."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CaptureFailed(f"the capture listing from the host is not JSON ({exc}): {text.strip()[:200]}") from None
    if not isinstance(doc, dict):
        raise CaptureFailed("the capture listing from the host is not a JSON object")
    sets = []
    for entry in doc.get("captures") or []:
        if not isinstance(entry, dict) or not isinstance(entry.get("id"), str) or not ID_RE.fullmatch(entry["id"]):
            continue
        calls = [
            CallInfo(
                name=str(c.get("name")),
                tp=int(_num(c, "tp")),
                layer=int(_num(c, "layer")),
                step=int(_num(c, "step")),
                bytes=int(_num(c, "bytes")),
                release=str(c.get("release") or "?"),
                captured_at=_num(c, "captured_at"),
                bs=int(c["bs"]) if isinstance(c.get("bs"), int) else None,
            )
            for c in entry.get("calls") or []
            if isinstance(c, dict)
        ]
        done: dict[int, RankDone] = {}
        for d in entry.get("done") or []:
            if not isinstance(d, dict) or not isinstance(d.get("tp"), int):
                continue
            done[d["tp"]] = RankDone(
                tp=d["tp"],
                calls=int(_num(d, "calls")),
                bytes=int(_num(d, "bytes")),
                steps=int(_num(d, "steps")),
                reason=str(d.get("reason") or "?"),
                release=str(d.get("release") or "?"),
                finished_at=_num(d, "finished_at"),
                needed=int(d["needed"]) if isinstance(d.get("needed"), int) else None,
                error=str(d["error"]) if d.get("error") else None,
            )
        sets.append(
            CaptureSet(
                id=entry["id"],
                mtime=_num(entry, "mtime"),
                bytes=int(_num(entry, "bytes")),
                calls=sorted(calls, key=lambda c: (c.tp, c.layer, c.step)),
                done=done,
                partial=int(_num(entry, "partial")),
            )
        )
    request = doc.get("request") if isinstance(doc.get("request"), dict) else None
    return Listing(now=_num(doc, "now", time.time()), directory=str(doc.get("dir") or ""), request=request, sets=sets)


def list_command(host: HostConfig) -> str:
    return host_captures.list_command(host.service.python, capture_dir(host))


# ---------------------------------------------------------------------------------------------- prune (pure plan)


@dataclass(frozen=True)
class PruneLimits:
    keep: int = DEFAULT_KEEP
    max_bytes: int = DEFAULT_KEEP_MB * 1024 * 1024
    max_age_s: float = DEFAULT_MAX_AGE_S


def prune_plan(listing: Listing, limits: PruneLimits, protect: Iterable[str] = ()) -> list[tuple[str, str]]:
    """(capture id, why) to remove, oldest first: older than ``max_age_s``; beyond the ``keep`` newest; and the
    oldest until the rest fit in ``max_bytes``. The armed capture and ``protect`` are never removed."""
    keep_always = set(protect) | ({listing.armed_id} if listing.armed_id else set())
    newest_first = sorted(listing.sets, key=lambda s: (s.created, s.id), reverse=True)
    doomed: dict[str, str] = {}
    kept = 0
    total = 0
    for s in newest_first:
        if s.id in keep_always:
            kept += 1
            total += s.bytes
            continue
        age = s.age_s(listing.now)
        if age > limits.max_age_s:
            doomed[s.id] = f"older than {_duration(limits.max_age_s)} ({_duration(age)})"
        elif kept >= limits.keep:
            doomed[s.id] = f"beyond the {limits.keep} newest"
        elif total + s.bytes > limits.max_bytes:
            doomed[s.id] = f"over {limits.max_bytes / 2**20:.0f} MB in all"
        else:
            kept += 1
            total += s.bytes
    return [(s.id, doomed[s.id]) for s in reversed(newest_first) if s.id in doomed]


def prune_command(host: HostConfig, ids: Iterable[str]) -> str:
    return host_captures.prune_command(capture_dir(host), ids)


def _duration(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.1f}h"
    return f"{seconds / 86400:.1f}d"


def age_text(seconds: float) -> str:
    return _duration(seconds)


# ---------------------------------------------------------------------------------------------- over SSH


def read_listing(r: Remote, host: HostConfig) -> Listing:
    res = r.run(list_command(host), timeout=120)
    return parse_listing(res.stdout)


def arm(
    r: Remote, host: HostConfig, *, layers: Iterable[int], steps: int, max_mb: float, ttl_s: float, by: str
) -> dict[str, Any]:
    """Write the request file (its expiry on the host's clock). Returns the request written."""
    now_res = r.run(host_captures.HOST_CLOCK_COMMAND, timeout=60)
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
    r.run(host_captures.prepare_dir_command(directory), timeout=60)
    r.write_file(f"{directory}/{REQUEST_FILE}", json.dumps(doc, indent=1) + "\n", mode=0o600)
    return doc


def disarm(r: Remote, host: HostConfig, capture_id: str) -> None:
    """Remove the request file if it still names ``capture_id`` (a newer request is left alone)."""
    r.run(host_captures.disarm_command(capture_dir(host), capture_id), timeout=60)


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
    progress: Callable[[CaptureSet | None, float], None] | None = None,
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


def prune(r: Remote, host: HostConfig, ids: Iterable[str]) -> None:
    r.run(prune_command(host, ids), timeout=300)


# ---------------------------------------------------------------------------------------------- replay


def replay_command(host: HostConfig, release_dir: str, token: str) -> ReleaseCommand:
    """The remote command (its line, and the token it reads from stdin) that replays every capture stored on ``host`` with the release in ``release_dir``
    (its kernel on the host's GPU, or its reference path without one), printing one ``[kdtree]`` parity line per
    stored call with ``token=<token>`` and ``capture=<id>/<call>``. Exit 0: every line's rel <= the host's
    ``gate.fail_rel`` (or nothing stored: ``captures=0``); 3: a line at or over it, or a damaged capture; 2: usage.
    Judge its stdout with :func:`judge_replay` (every line counts; ``tp=`` is the capturing rank)."""
    return capture_replay_command(
        host.service.python, release_dir, capture_dir(host), token, threshold=host.gate.fail_rel
    )


@dataclass
class ReplayJudgement:
    verdict: Verdict  # PASS, FAIL, INCONCLUSIVE, NODATA (nothing stored), ERROR (the replay could not run)
    reason: str
    judgements: list[Judgement]
    calls: int
    damaged: int
    state: GateState

    def to_json(self) -> dict[str, Any]:
        return {
            "verdict": str(self.verdict),
            "reason": self.reason,
            "calls": self.calls,
            "damaged": self.damaged,
            "lines": [
                {
                    "verdict": str(j.verdict),
                    "reason": j.reason,
                    "layer": j.line.layer if j.line else None,
                    "tp": j.line.rank if j.line else None,
                    "rel": j.line.rel if j.line and j.line.finite else str(j.line.rel if j.line else None),
                    "capture": j.line.extra.get("capture") if j.line else None,
                    "text": j.raw.strip(),
                }
                for j in self.judgements
            ],
        }


def judge_replay(stdout: str, rc: int, host: HostConfig, token: str, stderr: str = "") -> ReplayJudgement:
    """The capture replay's verdict, by the gate's own parser and rules: every line is judged (no K-pass stop),
    ranks are the host's ``service.tp``, only lines with ``token`` count. Pure."""
    state = GateState.every_line(host.gate, expected_ranks=host.service.tp, token=token)
    judgements = []
    calls = damaged = 0
    summary_seen = False
    for message in stdout.splitlines():
        m = SUMMARY_RE.match(message)
        if m:
            calls, damaged, summary_seen = int(m[1]), int(m[2]), True
        j = judge(state, message, 0.0)
        if j is not None:
            judgements.append(j)
    counted = state.lines
    skipped = [line for line in stderr.splitlines() if "skipped:" in line]
    if state.verdict is Verdict.FAIL:
        return ReplayJudgement(Verdict.FAIL, state.reason, judgements, calls, damaged, state)
    if rc == EXIT_REPLAY_FAILED and damaged:
        why = skipped[0].removeprefix("kdtree-replay: ") if skipped else f"{damaged} damaged capture(s)"
        return ReplayJudgement(Verdict.FAIL, f"capture replay: {why}", judgements, calls, damaged, state)
    if rc not in (0, EXIT_REPLAY_FAILED) or not summary_seen:
        # The replay's lines carry the token: an error message quotes its output without it.
        tail = " | ".join((stderr or stdout).strip().splitlines()[-3:]).replace(token, "<token>")
        return ReplayJudgement(
            Verdict.ERROR, f"capture replay could not run (exit {rc}): {tail}", judgements, calls, damaged, state
        )
    if counted == 0:
        ignored = state.counts[LineVerdict.IGNORED]
        why = f"{ignored} line(s) ignored (wrong or missing token)" if ignored else "no captures stored on the host"
        return ReplayJudgement(Verdict.NODATA, why, judgements, calls, damaged, state)
    if rc == EXIT_REPLAY_FAILED:
        return ReplayJudgement(
            Verdict.FAIL, "capture replay exited 3 (a line over the threshold)", judgements, calls, damaged, state
        )
    if state.counts[LineVerdict.INCONCLUSIVE]:
        n = state.counts[LineVerdict.INCONCLUSIVE]
        return ReplayJudgement(
            Verdict.INCONCLUSIVE, f"{n} of {counted} line(s) between pass and fail", judgements, calls, damaged, state
        )
    worst = state.worst.rel if state.worst is not None else 0.0
    return ReplayJudgement(
        Verdict.PASS, f"{counted} captured call(s) replayed, worst rel {worst:.3g}", judgements, calls, damaged, state
    )


# ---------------------------------------------------------------------------------------------- sessions
# One SSH session each, for the CLI (which never opens one itself).

Progress = Callable[[CaptureSet | None, float], None]


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
    from ..ssh.client import connect

    with connect(host) as r:
        snap = hoststate.read_snapshot(r, host.root, host.unit)
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


@dataclass(frozen=True)
class ListRun:
    listing: Listing  # as found, before anything was removed
    pruned: list[tuple[str, str]]  # (capture id, why) removed by the prune plan
    removed_request: RequestState | None  # the request file removed (--prune: an expired one; --disarm: any)


def request_to_remove(listing: Listing, *, prune: bool, disarm: bool) -> RequestState | None:
    """The request file ``captures`` removes: any with ``disarm``; with ``prune`` one that can no longer be
    taken (expired or unreadable), so it is never left for a later service to find. Pure."""
    req = listing.request_state
    if req is None or not (disarm or (prune and req.state != "armed")):
        return None
    return req


def list_captures(host: HostConfig, limits: PruneLimits | None, *, disarm: bool = False) -> ListRun:
    """What is stored; with ``limits`` the captures removed by the prune plan (and a dead request file); with
    ``disarm`` the request file removed whatever it names."""
    from ..ssh.client import connect

    with connect(host) as r:
        listing = read_listing(r, host)
        doomed = prune_plan(listing, limits) if limits is not None else []
        if doomed:
            prune(r, host, [ident for ident, _ in doomed])
        removed = request_to_remove(listing, prune=limits is not None, disarm=disarm)
        if removed is not None:
            r.run(host_captures.remove_request_command(capture_dir(host)), timeout=60)
    return ListRun(listing, doomed, removed)


@dataclass(frozen=True)
class ReplayRun:
    release: str
    judgement: ReplayJudgement
    stderr: str
    elapsed_s: float


def _release_dir(r: Remote, host: HostConfig, release: str) -> tuple[str, str]:
    """(release id, its directory on the host); 'current' is what the unit runs now."""
    releases = host_layout.Layout(host.root).releases
    if release == "current":
        res = r.run(host_layout.resolve_current_command(host.root), check=False, timeout=60)
        target = res.stdout.strip()
        if res.rc != 0 or not target.startswith(releases + "/"):
            raise UsageError(f"{host.name}: no current release under {releases} (deploy one first)")
        return target.rsplit("/", 1)[1], target
    if not (RELEASE_ID_RE.fullmatch(release) or ADOPTED_ID_RE.fullmatch(release)):
        raise UsageError(f"{release!r} is not a release id (like r0123456789ab) or 'current'")
    path = f"{releases}/{release}"
    if r.run(host_layout.is_dir_command(path), check=False, timeout=60).rc != 0:
        raise UsageError(f"{host.name}: release {release} is not on the host (opsctl releases {host.name} lists them)")
    return release, path


def replay_release(host: HostConfig, release: str, token: str) -> ReplayRun:
    """Replay every stored capture with ``release`` (an id, or 'current') on the host, nothing switched."""
    from ..ssh.client import connect

    with connect(host) as r:
        release_id, path = _release_dir(r, host, release)
        started = time.monotonic()
        command = replay_command(host, path, token)
        res = r.run(command.command, stdin=command.stdin, check=False, timeout=REPLAY_TIMEOUT_S)
    elapsed = time.monotonic() - started
    return ReplayRun(release_id, judge_replay(res.stdout, res.rc, host, token, res.stderr), res.stderr, elapsed)
