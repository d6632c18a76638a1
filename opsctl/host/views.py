"""What the read-only host commands (status, releases, service, lock, logs) do on a host, as library calls: the
CLI renders what these return and never opens SSH itself. The remote command lines come from ``opsctl.host``."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from ..errors import OpsError, UsageError
from ..inventory import HostConfig
from ..journal import query as journal_query
from ..lock import hostlock
from ..ssh.remote import Remote
from ..unit import systemctl
from . import history as host_history
from . import releaseroot
from .history import HistoryEvent, HistoryRecord

SERVICE_ACTIONS = ("start", "stop", "status")
T = TypeVar("T")

# ------------------------------------------------------------------------------------------------ commands (pure)


def _with_host(host: HostConfig, fn: Callable[[Remote], T]) -> T:
    from ..ssh import connect

    with connect(host) as r:
        return fn(r)


@dataclass(frozen=True)
class ReleasesView:
    snap: releaseroot.HostSnapshot
    history: list[HistoryRecord]
    meta: dict[str, dict[str, Any]]  # release -> created_at, commit, dirty (from its manifest)


def read_releases(host: HostConfig) -> ReleasesView:
    layout = releaseroot.Layout(host.root)

    def gather(r: Remote) -> ReleasesView:
        snap = releaseroot.read_snapshot(r, host.root, host.unit)
        meta = r.run(releaseroot.release_meta_command(layout), timeout=60, check=False).stdout
        return ReleasesView(snap, host_history.read_history(r, layout), releaseroot.parse_release_meta(meta))

    return _with_host(host, gather)


@dataclass(frozen=True)
class StatusView:
    snap: releaseroot.HostSnapshot
    history: list[HistoryRecord]
    # The running invocation's journal messages with the marker, oldest first, for the gate's judge to read: its
    # own lines, forgeries and the marker inside other messages alike.
    parity_messages: list[str]
    token: str | None  # the token the running invocation was handed (None before the first opsctl restart)


def read_status(host: HostConfig) -> StatusView:
    layout = releaseroot.Layout(host.root)

    def gather(r: Remote) -> StatusView:
        snap = releaseroot.read_snapshot(r, host.root, host.unit)
        text = ""
        if snap.unit.invocation_id:
            text = r.run(
                journal_query.latest_parity_lines_command(snap.unit.invocation_id),
                timeout=60,
                check=False,
            ).stdout
        messages = [x for x in text.split("\n") if x]  # \n only, as journald splits stdout
        token = releaseroot.read_parity_token(r, layout)
        return StatusView(snap, host_history.read_history(r, layout), messages, token)

    return _with_host(host, gather)


@dataclass(frozen=True)
class ServiceOutcome:
    action: str
    state: str  # `systemctl is-active` after the action ("" for status)
    status_text: str = ""  # `systemctl status` (action status)
    status_rc: int = 0


def service(host: HostConfig, action: str | None) -> ServiceOutcome:
    """Start, stop or show the unit (no gate). An action left out or unknown is refused before connecting."""
    if action is None or action not in SERVICE_ACTIONS:
        raise UsageError(f"service action must be start, stop or status, not {action!r}")

    def act(r: Remote) -> ServiceOutcome:
        if action == "status":
            res = r.run(systemctl.status_argv(host.unit), check=False, timeout=60)
            return ServiceOutcome(action, "", res.stdout.rstrip(), res.rc)
        r.run(systemctl.action_argv(action, host.unit), timeout=host.service.start_timeout_s + 60)
        state = r.run(systemctl.action_argv("is-active", host.unit), check=False, timeout=60).stdout.strip()
        return ServiceOutcome(action, state)

    return _with_host(host, act)


def read_lock(host: HostConfig, *, break_it: bool = False) -> releaseroot.HostSnapshot:
    """The host as it was when looked at (its lock owner and lease); ``break_it`` removes the lock whoever holds
    it and records a lock-break in the history."""
    layout = releaseroot.Layout(host.root)

    def act(r: Remote) -> releaseroot.HostSnapshot:
        snap = releaseroot.read_snapshot(r, host.root, host.unit)
        if break_it and snap.lock_present:
            hostlock.release_lock(r, layout, None)
            host_history.append_history(r, layout, HistoryRecord(HistoryEvent.LOCK_BREAK, owner=snap.lock_owner))
        return snap

    return _with_host(host, act)


def read_journal(
    host: HostConfig,
    on_line: Callable[[str], None],
    *,
    since: str | None,
    lines: int,
    follow: bool,
    kdtree_only: bool,
    on_token: Callable[[str | None], None] = lambda _token: None,
) -> None:
    """Each line of the unit's journal (``host.journal.logs_command``, JSON lines) to ``on_line``; following,
    until Ctrl-C. Before the first line, ``on_token`` hears the token the running invocation was handed (None
    before the first opsctl restart), so the lines can be judged as the gate judges them."""
    remote = journal_query.logs_command(host.unit, since=since, lines=lines, follow=follow, kdtree_only=kdtree_only)

    def act(r: Remote) -> None:
        on_token(releaseroot.read_parity_token(r, releaseroot.Layout(host.root)))
        if follow:
            with contextlib.suppress(KeyboardInterrupt):
                r.run(remote, timeout=10**8, check=False, on_output=on_line)
            return
        res = r.run(remote, timeout=120, check=False)
        if res.rc not in (0, 1):  # grep exits 1 on no match
            raise OpsError(f"{host.name}: journalctl failed ({res.rc}): {res.stderr.strip()[-300:]}")
        for line in res.stdout.split("\n"):  # one JSON entry a line; U+2028 inside an entry is not a line break
            if line:
                on_line(line)

    _with_host(host, act)
