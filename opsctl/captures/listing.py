"""What a host has stored under its capture directory, as data: the listing program's JSON
(:mod:`opsctl.captures.listing_on_host`) parsed into :class:`Listing` (capture sets, their calls and finished ranks,
the request file's state), and the one SSH call that reads it (:func:`read_listing`).

Everything here but :func:`read_listing` is pure.
"""

from __future__ import annotations

import datetime as dt
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kdtree_backend.wire import CAPTURE_ID_RE

from ..errors import OpsError
from ..inventory import HostConfig
from ..ssh.remote import Remote
from . import capturedir


class CaptureFailed(OpsError):
    """A capture that stored nothing usable, or did not finish in time; the message says why and what to do.

    Defined here, the lowest module that raises it (a listing that is not JSON); arming and the replay raise it
    too."""

    exit_code = 1


def capture_dir(host: HostConfig) -> str:
    """``<root>/state/capture`` on ``host``."""
    return capturedir.capture_dir(host.root)


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
            return f"capture {self.id} is armed (expires in {duration_text(self.expires_in_s or 0)})"
        if self.state == "expired":
            return f"a capture request {self.id} is left behind, expired {duration_text(-(self.expires_in_s or 0))} ago"
        return "an unreadable capture request file is left behind"

    def to_json(self) -> dict[str, Any]:
        remaining = None if self.expires_in_s is None else round(self.expires_in_s, 1)
        return {"id": self.id, "state": self.state, "expires_in_s": remaining}


def _num(doc: Mapping[str, Any], key: str, default: float = 0) -> float:
    value = doc.get(key, default)
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else float(default)


def _int_or_none(doc: Mapping[str, Any], key: str) -> int | None:
    value = doc.get(key)
    return int(value) if isinstance(value, int) else None


def _call_info(c: Mapping[str, Any]) -> CallInfo:
    """One stored call (the manifest's keys the listing program passes on)."""
    return CallInfo(
        name=str(c.get("name")),
        tp=int(_num(c, "tp")),
        layer=int(_num(c, "layer")),
        step=int(_num(c, "step")),
        bytes=int(_num(c, "bytes")),
        release=str(c.get("release") or "?"),
        captured_at=_num(c, "captured_at"),
        bs=_int_or_none(c, "bs"),
    )


def _rank_done(d: Mapping[str, Any]) -> RankDone:
    """One rank's finish document (``tp<N>.done.json``, written by the backend); ``d["tp"]`` is an int."""
    return RankDone(
        tp=d["tp"],
        calls=int(_num(d, "calls")),
        bytes=int(_num(d, "bytes")),
        steps=int(_num(d, "steps")),
        reason=str(d.get("reason") or "?"),
        release=str(d.get("release") or "?"),
        finished_at=_num(d, "finished_at"),
        needed=_int_or_none(d, "needed"),
        error=str(d["error"]) if d.get("error") else None,
    )


def _capture_set(entry: object) -> CaptureSet | None:
    """One capture of the listing; None for an entry that is not one (no id, or not a capture id). Calls and
    finish documents that are not objects are skipped; a rank's later document wins over an earlier one."""
    if not isinstance(entry, dict) or not isinstance(entry.get("id"), str) or not CAPTURE_ID_RE.fullmatch(entry["id"]):
        return None
    calls = [_call_info(c) for c in entry.get("calls") or [] if isinstance(c, dict)]
    done = {
        d["tp"]: _rank_done(d) for d in entry.get("done") or [] if isinstance(d, dict) and isinstance(d.get("tp"), int)
    }
    return CaptureSet(
        id=entry["id"],
        mtime=_num(entry, "mtime"),
        bytes=int(_num(entry, "bytes")),
        calls=sorted(calls, key=lambda c: (c.tp, c.layer, c.step)),
        done=done,
        partial=int(_num(entry, "partial")),
    )


def _listing_document(text: str) -> dict[str, Any]:
    """The listing program's output as a JSON object; :class:`CaptureFailed` when it is not one (a traceback,
    a python3 that did not run)."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CaptureFailed(f"the capture listing from the host is not JSON ({exc}): {text.strip()[:200]}") from None
    if not isinstance(doc, dict):
        raise CaptureFailed("the capture listing from the host is not a JSON object")
    return doc


def parse_listing(text: str) -> Listing:
    """The listing program's JSON -> :class:`Listing`. Garbled entries are skipped; garbled JSON is an error."""
    doc = _listing_document(text)
    sets = [s for s in map(_capture_set, doc.get("captures") or []) if s is not None]
    request = doc.get("request") if isinstance(doc.get("request"), dict) else None
    return Listing(now=_num(doc, "now", time.time()), directory=str(doc.get("dir") or ""), request=request, sets=sets)


def duration_text(seconds: float) -> str:
    """A span of time as an operator reads it: ``45s``, ``12m``, ``3.5h``, ``7.0d`` (negative spans are 0)."""
    seconds = max(0.0, seconds)
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.1f}h"
    return f"{seconds / 86400:.1f}d"


def read_listing(r: Remote, host: HostConfig) -> Listing:
    """What is stored on the host now (one remote command)."""
    config = capturedir.listing_config(capture_dir(host))
    res = capturedir.LISTING_PROGRAM.start(r, config, timeout=120, python=host.service.python, check=True)
    return parse_listing(res.stdout)
