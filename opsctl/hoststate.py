"""The layout of a release root on a host (docs/release-layout.md), and the operations on it.

<root>/releases/<id>/   one release (kernel/ backend/ deploy/ systemd/ manifest.json, built extension, unit.service)
<root>/current          symlink -> releases/<id>, switched by rename(2) of a temp symlink
<root>/state/           managed.json, history.jsonl, lock/ (atomic mkdir + owner.json), bad/<id>, last-good,
                        cursors/

Parsing and choices (snapshot parsing, which releases to clean up) are pure; the functions taking a remote
run one quoted command each. Nothing here ever deletes outside ``<root>/releases`` and ``<root>/state/lock``.
"""

from __future__ import annotations

import datetime as dt
import getpass
import json
import os
import secrets
import shlex
import socket
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from .errors import DeployFailed, LockHeld
from .release import ADOPTED_ID_RE, ID_RE


class CommandResultLike(Protocol):
    rc: int
    stdout: str
    stderr: str


class Remote(Protocol):
    def run(self, cmd: str | list[str], *, timeout: float | None = ..., check: bool = ..., stdin: Any = ...) -> Any: ...
    def write_file(self, path: str, data: bytes | str, mode: int = 0o644) -> None: ...
    def read_file(self, path: str) -> bytes: ...


def valid_id(release: str) -> bool:
    return bool(ID_RE.match(release) or ADOPTED_ID_RE.match(release))


def check_id(release: str) -> str:
    if not valid_id(release):
        raise DeployFailed(f"{release!r} is not a release id (like r0123456789ab)")
    return release


@dataclass(frozen=True)
class Layout:
    root: str

    @property
    def releases(self) -> str:
        return f"{self.root}/releases"

    @property
    def current(self) -> str:
        return f"{self.root}/current"

    @property
    def state(self) -> str:
        return f"{self.root}/state"

    @property
    def lock(self) -> str:
        return f"{self.state}/lock"

    @property
    def history(self) -> str:
        return f"{self.state}/history.jsonl"

    @property
    def bad(self) -> str:
        return f"{self.state}/bad"

    @property
    def last_good(self) -> str:
        return f"{self.state}/last-good"

    @property
    def managed(self) -> str:
        return f"{self.state}/managed.json"

    @property
    def parity_env(self) -> str:
        """The unit's EnvironmentFile holding this invocation's parity token (root-only, rewritten per restart)."""
        return f"{self.state}/parity.env"

    @property
    def cursors(self) -> str:
        return f"{self.state}/cursors"

    def release(self, release: str) -> str:
        return f"{self.releases}/{check_id(release)}"


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


def snapshot_command(root: str, unit: str) -> str:
    r, u = shlex.quote(root), shlex.quote(unit + ".service")
    return f"""R={r}; U={u}
echo "root_exists=$(test -d "$R" && echo 1 || echo 0)"
echo "managed=$(cat "$R/state/managed.json" 2>/dev/null | tr -d '\\n')"
echo "current=$(readlink "$R/current" 2>/dev/null)"
for d in "$R"/releases/*/; do [ -d "$d" ] && echo "release=$(stat -c %Y "$d") $(basename "$d")"; done
for f in "$R"/state/bad/*; do [ -f "$f" ] && echo "bad=$(basename "$f") $(head -c 800 "$f" | tr -d '\\n')"; done
echo "last_good=$(cat "$R/state/last-good" 2>/dev/null)"
if [ -d "$R/state/lock" ]; then echo "lock_present=1"; echo "lock=$(cat "$R/state/lock/owner.json" 2>/dev/null | tr -d '\\n')"; echo "lock_boot=$(cat "$R/state/lock/boot_id" 2>/dev/null)"; echo "lock_lease=$(cat "$R/state/lock/lease" 2>/dev/null || echo $(( $(stat -c %Y "$R/state/lock") + {int(UNLEASED_LOCK_S)} )))"; fi
echo "boot_id=$(cat /proc/sys/kernel/random/boot_id)"
if [ -d "$R" ]; then for e in "$R"/*; do [ -e "$e" ] && echo "entry=$(basename "$e")"; done; fi
P="$R"; while [ ! -d "$P" ]; do P=$(dirname "$P"); done
echo "free_mb=$(df -Pm "$P" | awk 'NR==2{{print $4}}')"
systemctl show -p LoadState,ActiveState,SubState,FragmentPath,NRestarts,InvocationID,Result,DropInPaths "$U" 2>/dev/null | sed 's/^/unit./'
if command -v nvidia-smi >/dev/null 2>&1; then echo "gpu_cc=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | sort -u | tr '\\n' ' ')"; fi
echo "now=$(date +%s)"
"""


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
    kv: dict[str, str] = {}
    releases: dict[str, float] = {}
    bad: set[str] = set()
    bad_reasons: dict[str, str] = {}
    entries: list[str] = []
    unit: dict[str, str] = {}
    for line in stdout.splitlines():
        key, sep, value = line.partition("=")
        if not sep:
            continue
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
        elif key.startswith("unit."):
            unit[key[5:]] = value
        else:
            kv[key] = value
    current_link = kv.get("current", "")
    current = current_link.rstrip("/").rsplit("/", 1)[-1] if current_link else None
    free = kv.get("free_mb", "")
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
        free_mb=int(free) if free.isdigit() else None,
        unit=info,
        gpu_compute_caps=tuple(kv.get("gpu_cc", "").split()),
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
    paths = [layout.release(i) for i in ids]  # check_id refuses anything that is not a release id
    if paths:
        r.run(["rm", "-rf", "--", *paths], timeout=600)


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


LOCK_LEASE_S = 120.0  # a lock's lease; the run holding it renews it every third of that (LeaseKeeper)
# A lock directory without a lease file (its taker died between mkdir and writing it) expires this long after
# the directory was made.
UNLEASED_LOCK_S = 60.0


def acquire_lock(
    r: Remote, layout: Layout, owner: LockOwner, host_name: str, lease_s: float = LOCK_LEASE_S
) -> str | None:
    """Take the deploy lock (atomic mkdir) with a lease of ``lease_s`` seconds (host clock).

    Idempotent for its owner: when the reply to an earlier attempt was lost, the retry finds its own token and
    succeeds. A lock from an earlier boot of the host, or whose lease ran out, is taken over; the old owner's
    description is returned then (for a warning). A lock held by a live lease raises ``LockHeld``."""
    lock, state = shlex.quote(layout.lock), shlex.quote(layout.state)
    owner_file = shlex.quote(f"{layout.lock}/owner.json")
    boot_file = shlex.quote(f"{layout.lock}/boot_id")
    lease_file = shlex.quote(f"{layout.lock}/lease")
    token = shlex.quote(owner.token)
    take = (
        f"printf '%s\\n' {shlex.quote(owner.to_json())} > {owner_file} && cp /proc/sys/kernel/random/boot_id {boot_file} "
        f"&& echo $(( $(date +%s) + {int(lease_s)} )) > {lease_file}"
    )
    cmd = (
        f"B=$(cat /proc/sys/kernel/random/boot_id); NOW=$(date +%s); mkdir -p {state} && "
        f"if mkdir {lock} 2>/dev/null; then {take} && echo ACQUIRED; "
        f"elif grep -qF {token} {owner_file} 2>/dev/null; then {take} && echo ACQUIRED; "
        f"else L=$(cat {lease_file} 2>/dev/null || echo $(( $(stat -c %Y {lock}) + {int(UNLEASED_LOCK_S)} ))); "
        f'if [ -f {boot_file} ] && [ "$(cat {boot_file})" != "$B" ]; then W=STALE; '
        f'elif [ "$NOW" -ge "$L" ] 2>/dev/null; then W=EXPIRED; else W=HELD; fi; '
        f'if [ "$W" = HELD ]; then echo "HELD $(( L - NOW ))"; cat {owner_file} 2>/dev/null || true; '
        f'else echo "$W $(( NOW - L ))"; cat {owner_file} 2>/dev/null; echo; rm -rf -- {lock} && mkdir {lock} && {take} && echo ACQUIRED; fi; fi'
    )
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
    owner_file = shlex.quote(f"{layout.lock}/owner.json")
    lease_file = shlex.quote(f"{layout.lock}/lease")
    out = r.run(
        f"if grep -qF {shlex.quote(owner.token)} {owner_file} 2>/dev/null; then "
        f"echo $(( $(date +%s) + {int(lease_s)} )) > {lease_file} && echo RENEWED; fi",
        timeout=60,
    )
    return "RENEWED" in out.stdout


def release_lock(r: Remote, layout: Layout, owner: LockOwner | None) -> bool:
    """Release our lock (only if the token is ours), or any lock when ``owner`` is None (forced)."""
    lock = shlex.quote(layout.lock)
    if owner is None:
        r.run(f"rm -rf -- {lock}", timeout=60)
        return True
    owner_file = shlex.quote(f"{layout.lock}/owner.json")
    token = shlex.quote(owner.token)
    out = r.run(f"if grep -qF {token} {owner_file} 2>/dev/null; then rm -rf -- {lock}; echo RELEASED; fi", timeout=60)
    return "RELEASED" in out.stdout


# ------------------------------------------------------------------------------------------ state changes


def utc_now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def ensure_layout(r: Remote, layout: Layout, *, adopted: bool) -> None:
    doc = json.dumps({"since": utc_now(), "adopted": adopted, "by": f"{getpass.getuser()}@{socket.gethostname()}"})
    dirs = [layout.releases, layout.state, layout.bad, layout.cursors]
    managed = shlex.quote(layout.managed)
    r.run(
        f"mkdir -p {' '.join(shlex.quote(d) for d in dirs)} && "
        f"{{ test -f {managed} || printf '%s\\n' {shlex.quote(doc)} > {managed}; }}",
        timeout=60,
    )


def append_history(r: Remote, layout: Layout, record: dict[str, Any]) -> None:
    """One JSON line per event; one small append (< PIPE_BUF) so concurrent readers never see half a line."""
    line = json.dumps({"at": utc_now(), **record}, sort_keys=True, default=str)
    r.run(
        f"mkdir -p {shlex.quote(layout.state)} && printf '%s\\n' {shlex.quote(line)} >> {shlex.quote(layout.history)}",
        timeout=60,
    )


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
    res = r.run(f"cat {shlex.quote(layout.history)} 2>/dev/null || true", timeout=60)
    return parse_history(res.stdout)


def switch_current(r: Remote, layout: Layout, release: str) -> None:
    """New symlink under a temp name, then rename(2) over ``current``: readers see the old or the new, never none."""
    target = f"releases/{check_id(release)}"
    tmp = f"{layout.root}/.current.tmp-{uuid.uuid4().hex[:8]}"
    r.run(
        f"test -d {shlex.quote(layout.release(release))} && ln -sfn {shlex.quote(target)} {shlex.quote(tmp)} "
        f"&& mv -Tf {shlex.quote(tmp)} {shlex.quote(layout.current)}",
        timeout=60,
    )


PARITY_TOKEN_VAR = "KDTREE_PARITY_TOKEN"  # read by kdtree_backend.lines; systemd passes it to the unit


def new_parity_token() -> str:
    return secrets.token_hex(16)


def write_parity_token(r: Remote, layout: Layout, token: str) -> None:
    """Hand the next invocation of the unit its parity token (EnvironmentFile, read by systemd at each start)."""
    r.run(["mkdir", "-p", "-m", "0700", "--", layout.state], timeout=60)
    r.write_file(layout.parity_env, f"{PARITY_TOKEN_VAR}={token}\n", mode=0o600)


def read_parity_token(r: Remote, layout: Layout) -> str | None:
    """The token the running invocation was started with (None before the first opsctl restart)."""
    res = r.run(f"cat -- {shlex.quote(layout.parity_env)} 2>/dev/null || true", timeout=60)
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
