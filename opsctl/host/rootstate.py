"""The state of a release root on a host (docs/release-layout.md), and the operations on it.

<root>/releases/<id>/   one release (kernel/ backend/ deploy/ systemd/ manifest.json, built extension, unit.service)
<root>/current          symlink -> releases/<id>, switched by rename(2) of a temp symlink
<root>/state/           managed.json, history.jsonl, lock/ (atomic mkdir + owner.json), bad/<id>, last-good,
                        cursors/

The commands are built in opsctl.host (layout, lock, facts); here they are run and their output read. Parsing
and choices (snapshot parsing, which releases to clean up) are pure; the functions taking a remote run one
command each. Nothing here ever deletes outside ``<root>/releases`` and ``<root>/state/lock``.
"""

from __future__ import annotations

import datetime as dt
import getpass
import json
import os
import secrets
import socket
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from ..errors import LockHeld
from ..lock import hostlock as host_lock
from ..lock.hostlock import LOCK_LEASE_S, UNLEASED_LOCK_S
from ..release import ADOPTED_ID_RE
from ..ssh.remote import CommandResultLike, Remote
from . import releaseroot as host_layout
from .facts import key_values, parse_facts
from .releaseroot import Layout, check_id, snapshot_command, valid_id
from .replay import PARITY_TOKEN_VAR

# The layout, lock and token names this module's functions take and write (built in opsctl.host), as its API.
__all__ = [
    "LOCK_LEASE_S",
    "PARITY_TOKEN_VAR",
    "UNLEASED_LOCK_S",
    "CommandResultLike",
    "HostSnapshot",
    "Layout",
    "LockOwner",
    "Remote",
    "UnitInfo",
    "acquire_lock",
    "append_history",
    "check_id",
    "describe_owner",
    "ensure_layout",
    "mark_bad",
    "new_parity_token",
    "parse_history",
    "parse_parity_env",
    "parse_snapshot",
    "read_history",
    "read_parity_token",
    "read_snapshot",
    "release_lock",
    "release_verdicts",
    "remove_releases",
    "renew_lock",
    "select_for_removal",
    "set_last_good",
    "snapshot_command",
    "switch_current",
    "utc_now",
    "valid_id",
    "write_parity_token",
]


# ---------------------------------------------------------------------------------------------- snapshot (pure)


@dataclass(frozen=True)
class UnitInfo:
    load_state: str = "not-found"
    active_state: str = "inactive"
    sub_state: str = "dead"
    fragment_path: str = ""
    n_restarts: int = 0
    invocation_id: str = ""
    result: str = ""
    drop_in_paths: str = ""

    @property
    def exists(self) -> bool:
        return self.load_state not in ("not-found", "")


@dataclass(frozen=True)
class HostSnapshot:
    """Everything preflight and status need, read in one command."""

    root_exists: bool
    managed: dict[str, Any] | None
    current: str | None
    releases: dict[str, float]  # id -> mtime
    bad: frozenset[str]
    last_good: str | None
    lock_owner: dict[str, Any] | None
    lock_present: bool
    free_mb: int | None
    unit: UnitInfo
    gpu_compute_caps: tuple[str, ...]
    now: float
    other_root_entries: tuple[str, ...] = field(default_factory=tuple)
    boot_id: str = ""
    lock_boot_id: str = ""
    bad_reasons: dict[str, str] = field(default_factory=dict)  # bad release -> why it was marked (its mark's reason)
    lock_expires_at: float | None = None  # host epoch seconds: the lock's lease, renewed by the run holding it

    @property
    def lock_stale(self) -> bool:
        """A lock that may be taken over: taken during an earlier boot (its holder's commands died with that boot),
        or whose lease ran out (its holder stopped renewing it: killed, or cut off for longer than the lease)."""
        if not self.lock_present:
            return False
        rebooted = bool(self.lock_boot_id) and self.lock_boot_id != self.boot_id
        return rebooted or (self.lock_remaining_s is not None and self.lock_remaining_s <= 0)

    @property
    def lock_remaining_s(self) -> float | None:
        """Seconds left on the lock's lease (negative: expired; None: no lease recorded)."""
        if not self.lock_present or self.lock_expires_at is None or not self.now:
            return None
        return self.lock_expires_at - self.now

    @property
    def is_managed(self) -> bool:
        return self.managed is not None

    @property
    def is_virgin(self) -> bool:
        """No unit and nothing in the root but opsctl's own entries (an interrupted first deploy leaves state/)."""
        return not self.unit.exists and not self.other_root_entries


def _json_or_none(text: str) -> dict[str, Any] | None:
    if not text:
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return {"unreadable": text[:200]}
    return value if isinstance(value, dict) else {"unreadable": text[:200]}


def _float_or_none(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def parse_snapshot(stdout: str) -> HostSnapshot:
    """snapshot_command's output -> HostSnapshot (the host facts in it are read by opsctl.host.facts)."""
    facts = parse_facts(stdout)
    kv: dict[str, str] = {}
    releases: dict[str, float] = {}
    bad: set[str] = set()
    bad_reasons: dict[str, str] = {}
    entries: list[str] = []
    for key, value in key_values(stdout):
        if key == "release":
            mtime, _, name = value.partition(" ")
            if valid_id(name):
                releases[name] = float(mtime or 0)
        elif key == "bad":
            name, _, mark = value.partition(" ")
            bad.add(name)
            reason = (_json_or_none(mark) or {}).get("reason")
            if isinstance(reason, str) and reason:
                bad_reasons[name] = reason
        elif key == "entry":
            entries.append(value)
        else:
            kv[key] = value
    current_link = kv.get("current", "")
    current = current_link.rstrip("/").rsplit("/", 1)[-1] if current_link else None
    unit = facts.unit
    info = UnitInfo(
        load_state=unit.get("LoadState", "not-found"),
        active_state=unit.get("ActiveState", "inactive"),
        sub_state=unit.get("SubState", "dead"),
        fragment_path=unit.get("FragmentPath", ""),
        n_restarts=int(unit.get("NRestarts") or 0),
        invocation_id=unit.get("InvocationID", ""),
        result=unit.get("Result", ""),
        drop_in_paths=unit.get("DropInPaths", ""),
    )
    return HostSnapshot(
        root_exists=kv.get("root_exists") == "1",
        managed=_json_or_none(kv.get("managed", "")),
        current=current,
        releases=releases,
        bad=frozenset(bad),
        last_good=kv.get("last_good") or None,
        lock_owner=_json_or_none(kv.get("lock", "")),
        lock_present=kv.get("lock_present") == "1",
        free_mb=facts.disk_free_mb,
        unit=info,
        gpu_compute_caps=facts.compute_caps,
        now=float(kv.get("now") or 0),
        other_root_entries=tuple(e for e in entries if e not in ("releases", "state", "current")),
        boot_id=kv.get("boot_id", ""),
        lock_boot_id=kv.get("lock_boot", ""),
        lock_expires_at=_float_or_none(kv.get("lock_lease", "")),
        bad_reasons=bad_reasons,
    )


def read_snapshot(r: Remote, root: str, unit: str) -> HostSnapshot:
    return parse_snapshot(r.run(snapshot_command(root, unit), timeout=60).stdout)


# --------------------------------------------------------------------------------------------- cleanup (pure)


def select_for_removal(releases: dict[str, float], keep: int, protected: Iterable[str | None]) -> list[str]:
    """Releases to delete so that ``keep`` remain: the protected ones (current, last good, the one being deployed)
    always stay and count towards ``keep``; the newest others fill the rest. The adopted release zero is kept
    besides (it is the only way back to a hand-made install). Oldest first."""
    protected_set = {p for p in protected if p and p in releases}
    zero = {rid for rid in releases if ADOPTED_ID_RE.match(rid)}
    room = max(0, keep - len(protected_set - zero))
    others = sorted(
        (rid for rid in releases if rid not in protected_set and rid not in zero),
        key=lambda rid: (releases[rid], rid),
        reverse=True,
    )
    return list(reversed(others[room:]))


def remove_releases(r: Remote, layout: Layout, ids: Iterable[str]) -> None:
    argv = host_layout.remove_releases_argv(layout, ids)  # refuses anything that is not a release id
    if argv:
        r.run(argv, timeout=600)


# ------------------------------------------------------------------------------------------------ lock


@dataclass(frozen=True)
class LockOwner:
    token: str
    user: str
    client: str
    pid: int
    command: str
    since: str

    @staticmethod
    def mine(command: str) -> LockOwner:
        return LockOwner(
            token=uuid.uuid4().hex,
            user=getpass.getuser(),
            client=socket.gethostname(),
            pid=os.getpid(),
            command=command,
            since=utc_now(),
        )

    def to_json(self) -> str:
        return json.dumps(self.__dict__, sort_keys=True)


def describe_owner(owner: dict[str, Any] | None) -> str:
    if not owner:
        return "an unknown owner (no owner.json: being taken right now, or left by a crashed run)"
    if "unreadable" in owner:
        return f"an unreadable owner record ({owner['unreadable']!r})"
    return f"{owner.get('user', '?')}@{owner.get('client', '?')} pid {owner.get('pid', '?')} since {owner.get('since', '?')} ({owner.get('command', '?')})"


def acquire_lock(
    r: Remote, layout: Layout, owner: LockOwner, host_name: str, lease_s: float = LOCK_LEASE_S
) -> str | None:
    """Take the deploy lock (atomic mkdir) with a lease of ``lease_s`` seconds (host clock).

    Idempotent for its owner: when the reply to an earlier attempt was lost, the retry finds its own token and
    succeeds. A lock from an earlier boot of the host, or whose lease ran out, is taken over; the old owner's
    description is returned then (for a warning). A lock held by a live lease raises ``LockHeld``."""
    cmd = host_lock.acquire_command(layout.state, layout.lock, owner.to_json(), owner.token, lease_s)
    out = r.run(cmd, timeout=60).stdout
    first, _, rest = out.partition("\n")
    word, _, figure = first.strip().partition(" ")
    if word == "ACQUIRED":
        return None
    if word in ("STALE", "EXPIRED") and rest.rstrip().endswith("ACQUIRED"):
        old = describe_owner(_json_or_none(rest.strip().splitlines()[0] if rest.strip() else ""))
        why = "from before a reboot" if word == "STALE" else f"whose lease ran out {figure}s ago"
        return f"{old} ({why})"
    who = describe_owner(_json_or_none(rest.strip()))
    left = f", lease {figure}s left" if word == "HELD" and figure.lstrip("-").isdigit() else ""
    raise LockHeld(
        f"{host_name}: the deploy lock {layout.lock} is held by {who}{left}. Wait for it, or if that run is gone: "
        f"opsctl lock {host_name} release --force"
    )


def renew_lock(r: Remote, layout: Layout, owner: LockOwner, lease_s: float = LOCK_LEASE_S) -> bool:
    """Extend our lease (only while the lock is still ours). False when it is not ours any more."""
    out = r.run(host_lock.renew_command(layout.lock, owner.token, lease_s), timeout=60)
    return "RENEWED" in out.stdout


def release_lock(r: Remote, layout: Layout, owner: LockOwner | None) -> bool:
    """Release our lock (only if the token is ours), or any lock when ``owner`` is None (forced)."""
    out = r.run(host_lock.release_command(layout.lock, owner.token if owner else None), timeout=60)
    if owner is None:
        return True
    return "RELEASED" in out.stdout


# ------------------------------------------------------------------------------------------ state changes


def utc_now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def ensure_layout(r: Remote, layout: Layout, *, adopted: bool) -> None:
    doc = json.dumps({"since": utc_now(), "adopted": adopted, "by": f"{getpass.getuser()}@{socket.gethostname()}"})
    r.run(host_layout.ensure_layout_command(layout, doc), timeout=60)


def append_history(r: Remote, layout: Layout, record: dict[str, Any]) -> None:
    """One JSON line per event; one small append (< PIPE_BUF) so concurrent readers never see half a line."""
    line = json.dumps({"at": utc_now(), **record}, sort_keys=True, default=str)
    r.run(host_layout.append_history_command(layout, line), timeout=60)


def parse_history(text: str) -> list[dict[str, Any]]:
    out = []
    for line in text.splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue  # a torn last line after a power cut is skipped, not fatal
        if isinstance(rec, dict):
            out.append(rec)
    return out


def read_history(r: Remote, layout: Layout) -> list[dict[str, Any]]:
    res = r.run(host_layout.read_history_command(layout), timeout=60)
    return parse_history(res.stdout)


def switch_current(r: Remote, layout: Layout, release: str) -> None:
    """New symlink under a temp name, then rename(2) over ``current``: readers see the old or the new, never none."""
    tmp_name = f".current.tmp-{uuid.uuid4().hex[:8]}"
    r.run(host_layout.switch_current_command(layout, release, tmp_name), timeout=60)


def new_parity_token() -> str:
    return secrets.token_hex(16)


def write_parity_token(r: Remote, layout: Layout, token: str) -> None:
    """Hand the next invocation of the unit its parity token (EnvironmentFile, read by systemd at each start)."""
    r.run(host_layout.make_private_dir_argv(layout.state), timeout=60)
    r.write_file(layout.parity_env, f"{PARITY_TOKEN_VAR}={token}\n", mode=0o600)


def read_parity_token(r: Remote, layout: Layout) -> str | None:
    """The token the running invocation was started with (None before the first opsctl restart)."""
    res = r.run(host_layout.read_quietly_command(layout.parity_env), timeout=60)
    return parse_parity_env(res.stdout)


def parse_parity_env(text: str) -> str | None:
    for line in text.splitlines():
        key, _, value = line.partition("=")
        if key.strip() == PARITY_TOKEN_VAR and value.strip():
            return value.strip()
    return None


def mark_bad(r: Remote, layout: Layout, release: str, reason: str) -> None:
    doc = json.dumps({"at": utc_now(), "reason": reason})
    r.write_file(f"{layout.bad}/{check_id(release)}", (doc + "\n").encode())


def set_last_good(r: Remote, layout: Layout, release: str) -> None:
    r.write_file(layout.last_good, (check_id(release) + "\n").encode())


def release_verdicts(history: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Latest gate record per release (for `releases` and `status`)."""
    out: dict[str, dict[str, Any]] = {}
    for rec in history:
        rid = rec.get("release")
        if isinstance(rid, str) and rec.get("verdict"):
            out[rid] = rec
    return out
