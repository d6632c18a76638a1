"""The SSH layer's own commands (opsctl.ssh.client): the wrapper every command runs in, the timeout's killer, file
writes and reads."""

from __future__ import annotations

import shlex

# Environment marker carried by every process a command starts; the timeout killer finds them by it.
RUN_MARKER = "OPSCTL_RUN_ID"


def wrap_command(command: str, run_id: str, sudo: bool) -> str:
    """``env MARKER=id sh -c CMD`` (through ``sudo -n`` when asked): every descendant inherits the marker, so a
    timeout can find and kill them all, daemonised ones included."""
    inner = f"env {RUN_MARKER}={shlex.quote(run_id)} sh -c {shlex.quote(command)}"
    return f"sudo -n {inner}" if sudo else inner


def kill_marked_command(run_id: str) -> str:
    """Kill every process carrying ``run_id``'s marker in its environment: TERM twice, then KILL what is left.
    Exits 0 once none is left."""
    marker = f"{RUN_MARKER}={run_id}"
    return (
        "scan() { for d in /proc/[0-9]*; do "
        f'grep -qxzF {shlex.quote(marker)} "$d/environ" 2>/dev/null && echo "${{d#/proc/}}"; '
        "done; }; "
        'for sig in TERM TERM KILL KILL KILL; do p=$(scan); [ -z "$p" ] && exit 0; '
        "kill -s $sig $p 2>/dev/null; sleep 0.3; done; "
        '[ -z "$(scan)" ]'
    )


def atomic_write_command(path: str, mode: int) -> str:
    """Write stdin to ``path`` atomically: a temp file beside it, fsync'ed, chmod'ed, then renamed over it."""
    p = shlex.quote(path)
    return (
        f"set -e; t=$(mktemp {p}.opsctl-XXXXXX); trap 'rm -f \"$t\"' EXIT; "
        f'cat > "$t"; chmod {mode:o} "$t"; sync "$t" 2>/dev/null || true; mv -f "$t" {p}; trap - EXIT'
    )


def cat_command(path: str) -> str:
    return f"cat -- {shlex.quote(path)}"
