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
from ..terminal import escaped

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


# The owner's token (the nonce that makes a lock ours) and its record travel on the command's stdin, never in the
# command text: sshd runs the command as `sh -c TEXT`, whose argv `ps` shows to every user of the host. The shell
# reads them into variables with its builtins (read, printf, case), so no program's argv carries them either.
_READ_TOKEN = "IFS= read -r T || true; "
_READ_OWNER = "IFS= read -r T || true; IFS= read -r O || true; "


def lock_input(token: str | None, owner_json: str = "") -> str:
    """The stdin of :func:`acquire_command` (token and owner record), :func:`renew_command` and
    :func:`release_command` (the token)."""
    if token is not None and ("\n" in token or "\n" in owner_json):
        raise ValueError("a lock token or owner record must be one line")
    return f"{token or ''}\n{owner_json}\n"


def _owns(lock_dir: str) -> str:
    """Shell text: true when the owner record holds the token read into $T (never true for an empty token)."""
    return f'[ -n "$T" ] && case "$(cat {_files(lock_dir)[0]} 2>/dev/null)" in *"$T"*) true ;; *) false ;; esac'


def _new_lease(lock_dir: str, lease_s: float) -> str:
    return f"echo $(( $(date +%s) + {int(lease_s)} )) > {_files(lock_dir)[2]}"


def acquire_command(state_dir: str, lock_dir: str, lease_s: float) -> str:
    """Take the lock for the owner whose token and record come on stdin (:func:`lock_input`): a fresh one, our own
    again (a retry whose first reply was lost), or one from an earlier boot or with an expired lease (taken
    over)."""
    lock = shlex.quote(lock_dir)
    owner_file, boot_file, _ = _files(lock_dir)
    take = (
        f"printf '%s\\n' \"$O\" > {owner_file} && cp /proc/sys/kernel/random/boot_id {boot_file} "
        f"&& {_new_lease(lock_dir, lease_s)}"
    )
    return (
        f"{_READ_OWNER}B=$(cat /proc/sys/kernel/random/boot_id); NOW=$(date +%s); mkdir -p {shlex.quote(state_dir)} "
        f"&& if mkdir {lock} 2>/dev/null; then {take} && echo ACQUIRED; "
        f"elif {_owns(lock_dir)}; then {take} && echo ACQUIRED; "
        f"else L=$({lease_expiry_expr(lock_dir)}); "
        f'if [ -f {boot_file} ] && [ "$(cat {boot_file})" != "$B" ]; then W=STALE; '
        f'elif [ "$NOW" -ge "$L" ] 2>/dev/null; then W=EXPIRED; else W=HELD; fi; '
        f'if [ "$W" = HELD ]; then echo "HELD $(( L - NOW ))"; cat {owner_file} 2>/dev/null || true; '
        f'else echo "$W $(( NOW - L ))"; cat {owner_file} 2>/dev/null; echo; '
        f"rm -rf -- {lock} && mkdir {lock} && {take} && echo ACQUIRED; fi; fi"
    )


def renew_command(lock_dir: str, lease_s: float) -> str:
    """Extend the lease, only while the lock is still the one of the token on stdin."""
    return f"{_READ_TOKEN}if {_owns(lock_dir)}; then {_new_lease(lock_dir, lease_s)} && echo RENEWED; fi"


def release_command(lock_dir: str, forced: bool = False) -> str:
    """Remove the lock when it is the token's on stdin; any lock when ``forced``."""
    remove = f"rm -rf -- {shlex.quote(lock_dir)}"
    if forced:
        return remove
    return f"{_READ_TOKEN}if {_owns(lock_dir)}; then {remove}; echo RELEASED; fi"


# ------------------------------------------------------------------------------------ the lock on a host


def json_object_or_none(text: str) -> dict[str, Any] | None:
    """A JSON object from a host file; ``{"unreadable": what is wrong}`` when it is none. The text itself is never
    kept there: the lock's owner.json holds the owner's token (a nonce), and a reason is printed."""
    if not text:
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:  # its msg is the parser's own words, never the text
        return {"unreadable": f"{len(text):,} characters, not JSON ({e.msg} at line {e.lineno} column {e.colno})"}
    except (ValueError, RecursionError):
        return {"unreadable": f"{len(text):,} characters, not JSON (a number too long, or nested too deep)"}
    if not isinstance(value, dict):
        return {"unreadable": f"{len(text):,} characters of JSON, not an object ({type(value).__name__})"}
    return value


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
        return f"an unreadable owner record ({escaped(str(owner['unreadable']))})"
    # The record's words come from a file on the host: escaped; its token never shown.
    user, client, pid, since, command = (
        escaped(str(owner.get(k, "?"))) for k in ("user", "client", "pid", "since", "command")
    )
    return f"{user}@{client} pid {pid} since {since} ({command})"


def acquire_lock(
    r: Remote, layout: Layout, owner: LockOwner, host_name: str, lease_s: float = LOCK_LEASE_S
) -> str | None:
    """Take the deploy lock (atomic mkdir) with a lease of ``lease_s`` seconds (host clock).

    Idempotent for its owner: when the reply to an earlier attempt was lost, the retry finds its own token and
    succeeds. A lock from an earlier boot of the host, or whose lease ran out, is taken over; the old owner's
    description is returned then (for a warning). A lock held by a live lease raises ``LockHeld``."""
    cmd = acquire_command(layout.state, layout.lock, lease_s)
    out = r.run(cmd, timeout=60, stdin=lock_input(owner.token, owner.to_json())).stdout
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
    out = r.run(renew_command(layout.lock, lease_s), timeout=60, stdin=lock_input(owner.token))
    return "RENEWED" in out.stdout


def release_lock(r: Remote, layout: Layout, owner: LockOwner | None) -> bool:
    """Release our lock (only if the token is ours), or any lock when ``owner`` is None (forced)."""
    if owner is None:
        r.run(release_command(layout.lock, forced=True), timeout=60)
        return True
    out = r.run(release_command(layout.lock), timeout=60, stdin=lock_input(owner.token))
    return "RELEASED" in out.stdout
