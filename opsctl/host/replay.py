"""Commands that run a release's own code on the host, from its directory: the extension build, and the replay
service (``python -m kdtree_backend.replay``) for the pre-restart parity check and the capture replay."""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field

from kdtree_backend.wire import PARITY_TOKEN_VAR, TOKEN_RE

from ..errors import UsageError

REPLAY_MODULE = "kdtree_backend.replay"


@dataclass(frozen=True)
class ReleaseCommand:
    """A command to run in a release with a parity token: ``command`` is the shell line (no secret in it, so
    neither ``ps`` on the host nor a CommandFailed message can show the token); ``stdin`` carries the token.
    Run it as ``r.run(c.command, stdin=c.stdin, ...)``."""

    command: str
    stdin: str = field(repr=False)
    token: str = field(repr=False)

    def redact(self, text: str) -> str:
        """``text`` (an output tail for an error message) without the token: the replay prints it in its lines."""
        return text.replace(self.token, "<token>")


def in_release_command(release_dir: str, token: str, argv: Sequence[str]) -> ReleaseCommand:
    """``argv`` run in ``release_dir`` with that release's kernel and backend on PYTHONPATH, its kdtree.json, and
    the parity token ``token`` (so only this run's lines count). The token is read from stdin into the
    environment (``$KDTREE_PARITY_TOKEN``, as systemd hands it to the unit from the 0600 token file): the
    environment of a process is readable only by its user and root, its argv by everyone."""
    if not TOKEN_RE.fullmatch(token):
        raise UsageError("the parity token must be 8-128 characters of [A-Za-z0-9_-]")
    rel = release_dir.rstrip("/")
    env = {
        "PYTHONPATH": f"{rel}/kernel:{rel}/backend",
        "KDTREE_CONFIG": f"{rel}/deploy/kdtree.json",
        "PYTHONUNBUFFERED": "1",
    }
    assignments = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
    command = (
        f"cd {shlex.quote(rel)} && IFS= read -r {PARITY_TOKEN_VAR} && export {PARITY_TOKEN_VAR} && "
        f"exec env {assignments} {shlex.join(argv)}"
    )
    return ReleaseCommand(command=command, stdin=token + "\n", token=token)


def synthetic_replay_command(
    python: str, release_dir: str, token: str, *, steps: int, threshold: float
) -> ReleaseCommand:
    """Replay ``steps`` synthetic verify steps with the release (the pre-restart parity check)."""
    argv = [python, "-m", REPLAY_MODULE, "--steps", str(steps), "--interval", "0", "--threshold", f"{threshold:g}"]
    return in_release_command(release_dir, token, argv)


def capture_replay_command(
    python: str, release_dir: str, capture_dir: str, token: str, *, threshold: float
) -> ReleaseCommand:
    """Replay every capture stored under ``capture_dir`` with the release."""
    argv = [python, "-m", REPLAY_MODULE, "--captures", capture_dir, "--threshold", f"{threshold:g}"]
    return in_release_command(release_dir, token, argv)


# What the capture-presence command prints when the capture directory holds nothing (absent, or empty).
NO_CAPTURES = "none"


def captures_present_command(capture_dir: str) -> str:
    """A shell line that prints :data:`NO_CAPTURES` when ``capture_dir`` is absent or empty, anything else
    otherwise: the pre-restart check then skips starting the release's replay (a Python process that imports
    torch, seconds) when nothing was ever captured. Anything unexpected (not a directory, unreadable) prints
    something else, and the replay runs and judges it."""
    d = shlex.quote(capture_dir)
    return f'if [ ! -e {d} ] || {{ [ -d {d} ] && [ -r {d} ] && [ -z "$(ls -A {d})" ]; }}; then echo {NO_CAPTURES}; else echo some; fi'


def build_argv(python: str, release_dir: str, *, arch: str, out_subdir: str, timeout_s: float) -> list[str]:
    """Build the release's extension for compute capability ``arch`` into ``<release>/<out_subdir>``."""
    rel = release_dir.rstrip("/")
    return [
        python,
        f"{rel}/deploy/build_extension.py",
        "--arch",
        arch,
        "--out",
        f"{rel}/{out_subdir}",
        "--log",
        f"{rel}/build.log",
        "--timeout",
        f"{timeout_s:g}",
    ]
