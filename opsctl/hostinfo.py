"""What the read-only host commands (status, releases, service, lock, logs) do on a host, as library calls: the
CLI renders what these return and never opens SSH itself. The remote command lines are built by the pure
``*_command`` functions (tested as text); the functions below them connect, run, parse."""

from __future__ import annotations

import contextlib
import json
import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from . import hoststate as hs
from .errors import OpsError, UsageError
from .inventory import HostConfig
from .parity import ParityLine, parse_line

SERVICE_ACTIONS = ("start", "stop", "status")
PARITY_LINES_SHOWN = 64
_META_LINE = re.compile(r'\s*"(created_at|commit|dirty)":\s*(.*?),?\s*$')

# ------------------------------------------------------------------------------------------------ commands (pure)


def release_meta_command(layout: hs.Layout) -> str:
    """Per release directory: `== ID`, then its manifest's created_at / commit / dirty lines."""
    return (
        f'for d in {shlex.quote(layout.releases)}/*/; do echo "== $(basename "$d")"; '
        'grep -m1 \'"created_at"\' "$d/manifest.json" 2>/dev/null; grep -m1 \'"commit"\' "$d/manifest.json" 2>/dev/null; '
        'grep -m1 \'"dirty"\' "$d/manifest.json" 2>/dev/null; done'
    )


def parse_release_meta(text: str) -> dict[str, dict[str, Any]]:
    """The output of ``release_meta_command`` -> {release: {created_at, commit, dirty}}. Pure."""
    out: dict[str, dict[str, Any]] = {}
    cur: dict[str, Any] | None = None
    for line in text.splitlines():
        if line.startswith("== "):
            cur = out.setdefault(line[3:].strip(), {})
            continue
        m = _META_LINE.match(line)
        if m and cur is not None:
            with contextlib.suppress(ValueError):
                cur[m.group(1)] = json.loads(m.group(2))
    return out


def parity_lines_command(invocation_id: str, most: int = PARITY_LINES_SHOWN) -> str:
    """The last ``most`` parity lines one invocation of the unit printed."""
    return (
        f"journalctl _SYSTEMD_INVOCATION_ID={shlex.quote(invocation_id)} -o cat --no-pager -q "
        f"| grep -F '[kdtree] L' | tail -n {int(most)}"
    )


def journal_command(unit: str, *, since: str | None, lines: int, follow: bool, kdtree_only: bool) -> str:
    """The unit's journal as JSON lines (message + time); ``kdtree_only`` keeps the ``[kdtree]`` lines."""
    argv = ["journalctl", "-u", unit + ".service", "-o", "json", "--output-fields=MESSAGE,__REALTIME_TIMESTAMP"]
    argv += ["--no-pager", "-q", *(["--since", since] if since else ["-n", str(int(lines))])]
    if follow:
        argv.append("-f")
    remote = shlex.join(argv)
    if kdtree_only:
        remote += " | grep --line-buffered -F " + shlex.quote("[kdtree]")
    return remote


# ------------------------------------------------------------------------------------------------ reads (I/O)


def _with_host(host: HostConfig, fn: Callable[[Any], Any]) -> Any:
    from .ssh import connect  # the SSH stack only when a host is really contacted

    with connect(host) as r:
        return fn(r)


@dataclass(frozen=True)
class ReleasesView:
    snap: hs.HostSnapshot
    history: list[dict[str, Any]]
    meta: dict[str, dict[str, Any]]  # release -> created_at, commit, dirty (from its manifest)


def read_releases(host: HostConfig) -> ReleasesView:
    layout = hs.Layout(host.root)

    def gather(r: Any) -> ReleasesView:
        snap = hs.read_snapshot(r, host.root, host.unit)
        meta = r.run(release_meta_command(layout), timeout=60, check=False).stdout
        return ReleasesView(snap, hs.read_history(r, layout), parse_release_meta(meta))

    result: ReleasesView = _with_host(host, gather)
    return result


@dataclass(frozen=True)
class StatusView:
    snap: hs.HostSnapshot
    history: list[dict[str, Any]]
    parity: list[ParityLine]  # the running invocation's own lines (its token), newest last


def read_status(host: HostConfig) -> StatusView:
    layout = hs.Layout(host.root)

    def gather(r: Any) -> StatusView:
        snap = hs.read_snapshot(r, host.root, host.unit)
        text = ""
        if snap.unit.invocation_id:
            text = r.run(parity_lines_command(snap.unit.invocation_id), timeout=60, check=False).stdout
        token = hs.read_parity_token(r, layout)
        # As the gate sees them: only lines with the running invocation's token are the service's own.
        parity = [
            p
            for p in (parse_line(x) for x in text.splitlines())
            if isinstance(p, ParityLine) and (token is None or p.token == token)
        ]
        return StatusView(snap, hs.read_history(r, layout), parity)

    result: StatusView = _with_host(host, gather)
    return result


@dataclass(frozen=True)
class ServiceOutcome:
    action: str
    state: str  # `systemctl is-active` after the action ("" for status)
    status_text: str = ""  # `systemctl status` (action status)
    status_rc: int = 0


def service(host: HostConfig, action: str) -> ServiceOutcome:
    """Start, stop or show the unit (no gate)."""
    if action not in SERVICE_ACTIONS:
        raise UsageError(f"service action must be start, stop or status, not {action!r}")
    unit = host.unit + ".service"

    def act(r: Any) -> ServiceOutcome:
        if action == "status":
            res = r.run(["systemctl", "status", "--no-pager", "-n", "15", unit], check=False, timeout=60)
            return ServiceOutcome(action, "", res.stdout.rstrip(), res.rc)
        r.run(["systemctl", action, unit], timeout=host.service.start_timeout_s + 60)
        return ServiceOutcome(action, r.run(["systemctl", "is-active", unit], check=False, timeout=60).stdout.strip())

    result: ServiceOutcome = _with_host(host, act)
    return result


def read_lock(host: HostConfig, *, break_it: bool = False) -> hs.HostSnapshot:
    """The host as it was when looked at (its lock owner and lease); ``break_it`` removes the lock whoever holds
    it and records a lock-break in the history."""
    layout = hs.Layout(host.root)

    def act(r: Any) -> hs.HostSnapshot:
        snap = hs.read_snapshot(r, host.root, host.unit)
        if break_it and snap.lock_present:
            hs.release_lock(r, layout, None)
            hs.append_history(r, layout, {"event": "lock-break", "owner": snap.lock_owner})
        return snap

    result: hs.HostSnapshot = _with_host(host, act)
    return result


def read_journal(host: HostConfig, remote: str, on_line: Callable[[str], None], *, follow: bool) -> None:
    """Each line of ``journal_command``'s output to ``on_line``; following, until Ctrl-C."""

    def act(r: Any) -> None:
        if follow:
            try:
                r.run(remote, timeout=10**8, check=False, on_output=on_line)
            except KeyboardInterrupt:
                return
            return
        res = r.run(remote, timeout=120, check=False)
        if res.rc not in (0, 1):  # grep exits 1 on no match
            raise OpsError(f"{host.name}: journalctl failed ({res.rc}): {res.stderr.strip()[-300:]}")
        for line in res.stdout.splitlines():
            on_line(line)

    _with_host(host, act)
