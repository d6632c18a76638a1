"""The deploy lock: ``<root>/state/lock/`` taken by an atomic mkdir, with ``owner.json`` (who), ``boot_id`` (the
boot it was taken in) and ``lease`` (host epoch seconds when it expires unless renewed).

The commands print one word the caller reads: :func:`acquire_command` ``ACQUIRED``, ``HELD <seconds left>``
(then the owner record), or ``STALE|EXPIRED <seconds>`` (then the old owner record, then ``ACQUIRED``);
:func:`renew_command` ``RENEWED``; :func:`release_command` ``RELEASED``.
"""

from __future__ import annotations

import shlex

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
