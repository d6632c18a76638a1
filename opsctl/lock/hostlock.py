"""The deploy lock: ``<root>/state/lock/`` taken by an atomic mkdir, with ``owner.json`` (who), ``boot_id`` (the
boot it was taken in) and ``lease`` (host epoch seconds when it expires unless renewed).

The commands print one word the caller reads: :func:`acquire_command` ``ACQUIRED``, ``HELD <seconds left>``
(then the owner record), or ``STALE|EXPIRED <seconds>`` (then the old owner record, then ``ACQUIRED``);
:func:`renew_command` ``RENEWED``; :func:`release_command` ``RELEASED``.
"""

from __future__ import annotations

import datetime as dt
import getpass
import json
import os
import shlex
import socket
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import LockHeld

if TYPE_CHECKING:
    from ..hostdata.layout import Layout
    from ..ssh.remote import Remote

LOCK_LEASE_S = 120.0  # a lock's lease; the run holding it renews it every third of that
# A lock directory without a lease file (its taker died between mkdir and writing it) expires this long after
# the directory was made.
UNLEASED_LOCK_S = 60.0


def lease_expiry_expr(lock_dir: str) -> str:
    """Shell text printing the lock's expiry: its lease file, else the directory's mtime + UNLEASED_LOCK_S."""
    lock = shlex.quote(lock_dir)
    return f"cat {lock}/lease 2>/dev/null || echo $(( $(stat -c %Y {lock}) + {int(UNLEASED_LOCK_S)} ))"


def _files(lock_dir: str) -> tuple[str, str, str]:
    """The owner record, boot id and lease files, quoted."""
    return (
        shlex.quote(f"{lock_dir}/owner.json"),
        shlex.quote(f"{lock_dir}/boot_id"),
        shlex.quote(f"{lock_dir}/lease"),
    )


def _owns(lock_dir: str, token: str) -> str:
    return f"grep -qF {shlex.quote(token)} {_files(lock_dir)[0]} 2>/dev/null"


def _new_lease(lock_dir: str, lease_s: float) -> str:
    return f"echo $(( $(date +%s) + {int(lease_s)} )) > {_files(lock_dir)[2]}"


def acquire_command(state_dir: str, lock_dir: str, owner_json: str, token: str, lease_s: float) -> str:
    """Take the lock for the owner ``owner_json`` (which holds ``token``): a fresh one, our own again (a retry
    whose first reply was lost), or one from an earlier boot or with an expired lease (taken over)."""
    lock = shlex.quote(lock_dir)
    owner_file, boot_file, _ = _files(lock_dir)
    take = (
        f"printf '%s\\n' {shlex.quote(owner_json)} > {owner_file} && cp /proc/sys/kernel/random/boot_id {boot_file} "
        f"&& {_new_lease(lock_dir, lease_s)}"
    )
    return (
        f"B=$(cat /proc/sys/kernel/random/boot_id); NOW=$(date +%s); mkdir -p {shlex.quote(state_dir)} && "
        f"if mkdir {lock} 2>/dev/null; then {take} && echo ACQUIRED; "
        f"elif {_owns(lock_dir, token)}; then {take} && echo ACQUIRED; "
        f"else L=$({lease_expiry_expr(lock_dir)}); "
        f'if [ -f {boot_file} ] && [ "$(cat {boot_file})" != "$B" ]; then W=STALE; '
        f'elif [ "$NOW" -ge "$L" ] 2>/dev/null; then W=EXPIRED; else W=HELD; fi; '
        f'if [ "$W" = HELD ]; then echo "HELD $(( L - NOW ))"; cat {owner_file} 2>/dev/null || true; '
        f'else echo "$W $(( NOW - L ))"; cat {owner_file} 2>/dev/null; echo; '
        f"rm -rf -- {lock} && mkdir {lock} && {take} && echo ACQUIRED; fi; fi"
    )


def renew_command(lock_dir: str, token: str, lease_s: float) -> str:
    """Extend the lease, only while the lock is still ``token``'s."""
    return f"if {_owns(lock_dir, token)}; then {_new_lease(lock_dir, lease_s)} && echo RENEWED; fi"


def release_command(lock_dir: str, token: str | None) -> str:
    """Remove the lock when it is ``token``'s; any lock when ``token`` is None (forced)."""
    remove = f"rm -rf -- {shlex.quote(lock_dir)}"
    if token is None:
        return remove
    return f"if {_owns(lock_dir, token)}; then {remove}; echo RELEASED; fi"


# ------------------------------------------------------------------------------------ the lock on a host


def json_object_or_none(text: str) -> dict[str, Any] | None:
    if not text:
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return {"unreadable": text[:200]}
    return value if isinstance(value, dict) else {"unreadable": text[:200]}


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
            since=dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
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
    cmd = acquire_command(layout.state, layout.lock, owner.to_json(), owner.token, lease_s)
    out = r.run(cmd, timeout=60).stdout
    first, _, rest = out.partition("\n")
    word, _, figure = first.strip().partition(" ")
    if word == "ACQUIRED":
        return None
    if word in ("STALE", "EXPIRED") and rest.rstrip().endswith("ACQUIRED"):
        old = describe_owner(json_object_or_none(rest.strip().split("\n")[0] if rest.strip() else ""))
        why = "from before a reboot" if word == "STALE" else f"whose lease ran out {figure}s ago"
        return f"{old} ({why})"
    who = describe_owner(json_object_or_none(rest.strip()))
    left = f", lease {figure}s left" if word == "HELD" and figure.lstrip("-").isdigit() else ""
    raise LockHeld(
        f"{host_name}: the deploy lock {layout.lock} is held by {who}{left}. Wait for it, or if that run is gone: "
        f"opsctl lock {host_name} release --force"
    )


def renew_lock(r: Remote, layout: Layout, owner: LockOwner, lease_s: float = LOCK_LEASE_S) -> bool:
    """Extend our lease (only while the lock is still ours). False when it is not ours any more."""
    out = r.run(renew_command(layout.lock, owner.token, lease_s), timeout=60)
    return "RENEWED" in out.stdout


def release_lock(r: Remote, layout: Layout, owner: LockOwner | None) -> bool:
    """Release our lock (only if the token is ours), or any lock when ``owner`` is None (forced)."""
    out = r.run(release_command(layout.lock, owner.token if owner else None), timeout=60)
    if owner is None:
        return True
    return "RELEASED" in out.stdout
