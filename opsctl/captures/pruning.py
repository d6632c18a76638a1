"""Removing old captures (and a request file nothing will take) from a host: the pure prune plan, its remote
command, and ``opsctl captures``' one SSH session (:func:`list_captures`: list, then prune or disarm).

Captured activations derive from users' prompts, so they expire (:data:`DEFAULT_MAX_AGE_S`) as well as being
bounded in count and size.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ..inventory import HostConfig
from ..ssh.remote import Remote
from . import capturedir
from .listing import Listing, RequestState, capture_dir, duration_text, read_listing

DEFAULT_KEEP = 10
DEFAULT_KEEP_MB = 8192
DEFAULT_MAX_AGE_S = 7 * 86400  # captured activations derive from users' prompts: they expire


@dataclass(frozen=True)
class PruneLimits:
    """What ``--prune`` (and every ``opsctl capture``, before it arms) keeps: the newest ``keep`` captures, at most
    ``max_bytes`` in all, none older than ``max_age_s``."""

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
            doomed[s.id] = f"older than {duration_text(limits.max_age_s)} ({duration_text(age)})"
        elif kept >= limits.keep:
            doomed[s.id] = f"beyond the {limits.keep} newest"
        elif total + s.bytes > limits.max_bytes:
            doomed[s.id] = f"over {limits.max_bytes / 2**20:.0f} MB in all"
        else:
            kept += 1
            total += s.bytes
    return [(s.id, doomed[s.id]) for s in reversed(newest_first) if s.id in doomed]


def prune_command(host: HostConfig, ids: Iterable[str]) -> str:
    """The remote command that removes those captures from ``host`` (anything not a capture id is refused)."""
    return capturedir.prune_command(capture_dir(host), ids)


def prune(r: Remote, host: HostConfig, ids: Iterable[str]) -> None:
    """Remove those captures from the host (one remote command)."""
    r.run(prune_command(host, ids), timeout=300)


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
    from ..ssh import connect

    with connect(host) as r:
        listing = read_listing(r, host)
        doomed = prune_plan(listing, limits) if limits is not None else []
        if doomed:
            prune(r, host, [ident for ident, _ in doomed])
        removed = request_to_remove(listing, prune=limits is not None, disarm=disarm)
        if removed is not None:
            r.run(capturedir.remove_request_command(capture_dir(host)), timeout=60)
    return ListRun(listing, doomed, removed)
