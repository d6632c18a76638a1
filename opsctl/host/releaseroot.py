"""The release root on a host (docs/release-layout.md) and the commands that read and change it.

<root>/releases/<id>/   one release
<root>/current          symlink -> releases/<id>, switched by rename(2) of a temp symlink
<root>/state/           managed.json, history.jsonl, lock/, bad/<id>, last-good, parity.env, cursors/

Every path a command names goes through :class:`opsctl.hostdata.layout.Layout`, whose ``release`` refuses anything
but a release id: nothing built here deletes outside ``<root>/releases`` and ``<root>/state/lock``.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import getpass
import json
import re
import secrets
import shlex
import socket
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from ..hostdata.facts import facts_command, key_values, parse_facts
from ..hostdata.layout import Layout, check_id, valid_id
from ..lock.hostlock import json_object_or_none, lease_expiry_expr
from ..release import ADOPTED_ID_RE
from ..ssh.remote import Remote
from .replay import PARITY_TOKEN_VAR


def snapshot_command(root: str, unit: str) -> str:
    """Everything preflight and status need, in one command: the layout's ``key=value`` lines (parsed by
    ``parse_snapshot``) followed by the host facts (:func:`opsctl.hostdata.facts.facts_command`)."""
    lay = Layout(root)
    r = shlex.quote(root)
    return f"""R={r}
echo "root_exists=$(test -d "$R" && echo 1 || echo 0)"
echo "managed=$(cat "$R/state/managed.json" 2>/dev/null | tr -d '\\n')"
echo "current=$(readlink "$R/current" 2>/dev/null)"
for d in "$R"/releases/*/; do [ -d "$d" ] && echo "release=$(stat -c %Y "$d") $(basename "$d")"; done
for f in "$R"/state/bad/*; do [ -f "$f" ] && echo "bad=$(basename "$f") $(head -c 800 "$f" | tr -d '\\n')"; done
echo "last_good=$(cat "$R/state/last-good" 2>/dev/null)"
if [ -d "$R/state/lock" ]; then echo "lock_present=1"; echo "lock=$(cat "$R/state/lock/owner.json" 2>/dev/null | tr -d '\\n')"; echo "lock_boot=$(cat "$R/state/lock/boot_id" 2>/dev/null)"; echo "lock_lease=$({lease_expiry_expr(lay.lock)})"; fi
echo "boot_id=$(cat /proc/sys/kernel/random/boot_id)"
if [ -d "$R" ]; then for e in "$R"/*; do [ -e "$e" ] && echo "entry=$(basename "$e")"; done; fi
echo "now=$(date +%s)"
{facts_command(root, unit)}
"""


def ensure_layout_command(layout: Layout, managed_doc: str) -> str:
    """Create the directories, and ``managed.json`` with ``managed_doc`` unless the root is managed already."""
    dirs = [layout.releases, layout.state, layout.bad, layout.cursors]
    managed = shlex.quote(layout.managed)
    return (
        f"mkdir -p {' '.join(shlex.quote(d) for d in dirs)} && "
        f"{{ test -f {managed} || printf '%s\\n' {shlex.quote(managed_doc)} > {managed}; }}"
    )


def read_quietly_command(path: str) -> str:
    """``cat`` that prints nothing, and succeeds, when the file is not there."""
    return f"cat -- {shlex.quote(path)} 2>/dev/null || true"


def switch_current_command(layout: Layout, release: str, tmp_name: str) -> str:
    """New symlink under ``tmp_name`` (in the root), then rename(2) over ``current``: readers see the old or the
    new target, never none. Fails when the release is not there."""
    tmp = f"{layout.root}/{tmp_name}"
    target = f"releases/{check_id(release)}"
    return (
        f"test -d {shlex.quote(layout.release(release))} && ln -sfn {shlex.quote(target)} {shlex.quote(tmp)} "
        f"&& mv -Tf {shlex.quote(tmp)} {shlex.quote(layout.current)}"
    )


def remove_releases_argv(layout: Layout, ids: Iterable[str]) -> list[str] | None:
    """``rm -rf`` of those releases (None when there are none); every id is checked to be a release id."""
    paths = [layout.release(i) for i in ids]
    return ["rm", "-rf", "--", *paths] if paths else None


def make_private_dir_argv(path: str) -> list[str]:
    return ["mkdir", "-p", "-m", "0700", "--", path]


def verify_checksums_command(release_dir: str) -> str:
    """Check the release's files against the manifest's ``sha256sum`` list, given on stdin."""
    return f"cd {shlex.quote(release_dir)} && sha256sum --quiet --strict -c -"


_CHECK_FAILED = re.compile(r"^(\\?)(.*): FAILED( open or read)?$")


def parse_checksum_failures(stdout: str) -> list[str]:
    """The files :func:`verify_checksums_command` found wrong (content differs, or missing/unreadable), in its
    order. sha256sum marks a name holding a backslash or newline with a leading backslash and escapes them. Pure."""
    failed = []
    for line in stdout.split("\n"):
        m = _CHECK_FAILED.match(line)
        if m:
            name = m.group(2)
            if m.group(1):
                name = re.sub(r"\\(.)", lambda e: "\n" if e.group(1) == "n" else e.group(1), name)
            failed.append(name)
    return failed


def release_meta_command(layout: Layout) -> str:
    """Per release: ``== <id>`` then its manifest's created_at, commit and dirty lines."""
    fields = "; ".join(f'grep -m1 \'"{k}"\' "$d/manifest.json" 2>/dev/null' for k in ("created_at", "commit", "dirty"))
    return f'for d in {shlex.quote(layout.releases)}/*/; do echo "== $(basename "$d")"; {fields}; done'


_META_LINE = re.compile(r'\s*"(created_at|commit|dirty)":\s*(.*?),?\s*$')


def parse_release_meta(text: str) -> dict[str, dict[str, Any]]:
    """The output of :func:`release_meta_command` -> {release: {created_at, commit, dirty}}. Pure."""
    out: dict[str, dict[str, Any]] = {}
    cur: dict[str, Any] | None = None
    for line in text.split("\n"):
        if line.startswith("== "):
            cur = out.setdefault(line[3:].strip(), {})
            continue
        m = _META_LINE.match(line)
        if m and cur is not None:
            with contextlib.suppress(ValueError):
                cur[m.group(1)] = json.loads(m.group(2))
    return out


# ------------------------------------------------------------------------------------------------ reads (I/O)


def foreign_files_command(root: str) -> str:
    """sha256sum of every file in ``root`` that opsctl did not put there (adopt: the hand-made install)."""
    return (
        f"cd {shlex.quote(root)} && find . \\( -path ./releases -o -path ./state -o -path ./current \\) -prune "
        "-o -type f -print0 | sort -z | xargs -0 -r sha256sum"
    )


def size_mb_command(root: str, entries: Iterable[str]) -> str:
    """Total MiB of ``entries`` (names in ``root``)."""
    names = " ".join(shlex.quote(e) for e in entries) or "/dev/null"
    return f"cd {shlex.quote(root)} && du -smc -- {names} | tail -n 1"


def resolve_current_command(root: str) -> str:
    return f"readlink -f -- {shlex.quote(root + '/current')}"


def is_dir_command(path: str) -> str:
    return f"test -d {shlex.quote(path)}"


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


def _float_or_none(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def parse_snapshot(stdout: str) -> HostSnapshot:
    """snapshot_command's output -> HostSnapshot (the host facts in it are read by opsctl.hostdata.facts)."""
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
            reason = (json_object_or_none(mark) or {}).get("reason")
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
        managed=json_object_or_none(kv.get("managed", "")),
        current=current,
        releases=releases,
        bad=frozenset(bad),
        last_good=reconciled_last_good(kv.get("last_good") or None, frozenset(bad)),
        lock_owner=json_object_or_none(kv.get("lock", "")),
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
    """Releases to delete: every one but the ``keep`` newest, the protected ones (current, last good, the one being
    deployed) and the adopted release zero (the only way back to a hand-made install). So at most ``keep`` plus
    those few remain, whatever the order of passes and failures. Oldest first."""
    protected_set = {p for p in protected if p and p in releases}
    zero = {rid for rid in releases if ADOPTED_ID_RE.match(rid)}
    newest = sorted(releases, key=lambda rid: (releases[rid], rid), reverse=True)[:keep]
    kept = protected_set | zero | set(newest)
    return sorted((rid for rid in releases if rid not in kept), key=lambda rid: (releases[rid], rid))


def remove_releases(r: Remote, layout: Layout, ids: Iterable[str]) -> None:
    argv = remove_releases_argv(layout, ids)  # refuses anything that is not a release id
    if argv:
        r.run(argv, timeout=600)


# ------------------------------------------------------------------------------------------ state changes


def utc_now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def ensure_layout(r: Remote, layout: Layout, *, adopted: bool) -> None:
    doc = json.dumps({"since": utc_now(), "adopted": adopted, "by": f"{getpass.getuser()}@{socket.gethostname()}"})
    r.run(ensure_layout_command(layout, doc), timeout=60)


def switch_current(r: Remote, layout: Layout, release: str) -> None:
    """New symlink under a temp name, then rename(2) over ``current``: readers see the old or the new, never none."""
    tmp_name = f".current.tmp-{uuid.uuid4().hex[:8]}"
    r.run(switch_current_command(layout, release, tmp_name), timeout=60)


def remove_current_command(layout: Layout) -> str:
    """Remove the ``current`` symlink (only a symlink: never a directory a hand-made install put there)."""
    cur = shlex.quote(layout.current)
    return f"if [ -L {cur} ]; then rm -f -- {cur}; fi"


def remove_current(r: Remote, layout: Layout) -> None:
    """No release is current: what a rejected first deploy leaves (the unit finds no WorkingDirectory to start)."""
    r.run(remove_current_command(layout), timeout=60)


def new_parity_token() -> str:
    return secrets.token_hex(16)


def write_parity_token(r: Remote, layout: Layout, token: str) -> None:
    """Hand the next invocation of the unit its parity token (EnvironmentFile, read by systemd at each start)."""
    r.run(make_private_dir_argv(layout.state), timeout=60)
    r.write_file(layout.parity_env, f"{PARITY_TOKEN_VAR}={token}\n", mode=0o600)


def read_parity_token(r: Remote, layout: Layout) -> str | None:
    """The token the running invocation was started with (None before the first opsctl restart)."""
    res = r.run(read_quietly_command(layout.parity_env), timeout=60)
    return parse_parity_env(res.stdout)


def parse_parity_env(text: str) -> str | None:
    for key, value in key_values(text):
        if key.strip() == PARITY_TOKEN_VAR and value.strip():
            return value.strip()
    return None


def forget_last_good_command(layout: Layout, release: str) -> str:
    """Remove ``state/last-good`` when it names ``release`` (and only then)."""
    lg = shlex.quote(layout.last_good)
    return f'if [ "$(cat -- {lg} 2>/dev/null)" = {shlex.quote(check_id(release))} ]; then rm -f -- {lg}; fi'


def mark_bad(r: Remote, layout: Layout, release: str, reason: str) -> None:
    """Mark ``release`` bad; a release is never last good and bad at once (issue 47), so a last-good mark naming it
    goes (the newest verdict wins; the history keeps both)."""
    doc = json.dumps({"at": utc_now(), "reason": reason})
    r.write_file(f"{layout.bad}/{check_id(release)}", (doc + "\n").encode())
    r.run(forget_last_good_command(layout, release), timeout=60)


def set_last_good(r: Remote, layout: Layout, release: str) -> None:
    """Record ``release`` as last good: a gate passed it. A bad mark of an earlier verdict on it goes (a later PASS
    of the same release clears it, issue 47; the history keeps both records)."""
    r.run(["rm", "-f", "--", f"{layout.bad}/{check_id(release)}"], timeout=60)
    r.write_file(layout.last_good, (check_id(release) + "\n").encode())


def reconciled_last_good(last_good: str | None, bad: frozenset[str]) -> str | None:
    """The last-good release as every view shows it: never one marked bad (a host written by an older opsctl may
    hold both marks; the bad one is the cautious reading, and ``set_last_good`` clears it at the next PASS). Pure."""
    return None if last_good in bad else last_good
