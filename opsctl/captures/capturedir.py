"""The capture directory on a host (``<root>/state/capture``, docs/capture.md): list (the listing program and its
configuration), arm, disarm, prune."""

from __future__ import annotations

import shlex
from collections.abc import Iterable

from kdtree_backend.wire import CAPTURE_ID_RE

from ..errors import UsageError
from ..ssh.hostprogram import HostProgram

CAPTURE_SUBDIR = "state/capture"
REQUEST_FILE = "request.json"
HOST_CLOCK_COMMAND = "date +%s"


def capture_dir(root: str) -> str:
    return f"{root}/{CAPTURE_SUBDIR}"


def check_capture_id(capture_id: str, refusal: str | None = None) -> str:
    """``capture_id`` when it is one; else UsageError (``refusal``, or "bad capture id ...")."""
    if not CAPTURE_ID_RE.fullmatch(capture_id):
        raise UsageError(refusal or f"bad capture id {capture_id!r}")
    return capture_id


# The listing program run on the host (:mod:`opsctl.captures.listing_on_host`), as shipped: the installed module's
# own file, with its configuration (``listing_config``) on stdin.
LISTING_PROGRAM = HostProgram("opsctl.captures", ("listing_on_host.py",), "the capture listing")


def listing_config(directory: str) -> dict[str, str]:
    """What the listing program is told: the directory to list, the capture-id pattern and the request file's
    name (the program on the host cannot import the last two)."""
    return {"dir": directory, "id_pattern": CAPTURE_ID_RE.pattern, "request_file": REQUEST_FILE}


def prepare_dir_command(directory: str) -> str:
    """The capture directory, root-only, whether it existed or not."""
    d = shlex.quote(directory)
    return f"mkdir -p -m 0700 -- {d} && chmod 0700 -- {d}"


def disarm_command(directory: str, capture_id: str) -> str:
    """Remove the request file if it still names ``capture_id`` (a newer request is left alone)."""
    path = shlex.quote(f"{directory}/{REQUEST_FILE}")
    return f"if grep -qF {shlex.quote(check_capture_id(capture_id))} {path} 2>/dev/null; then rm -f -- {path}; fi"


def remove_request_command(directory: str) -> str:
    """Remove the request file, whatever it names (``captures --disarm``, or an expired one on --prune)."""
    return f"rm -f -- {shlex.quote(f'{directory}/{REQUEST_FILE}')}"


def prune_command(directory: str, ids: Iterable[str]) -> str:
    """Remove those captures; anything that is not a capture id is refused before a command exists."""
    paths = [
        shlex.quote(f"{directory}/{check_capture_id(i, f'refusing to remove {i!r}: not a capture id')}") for i in ids
    ]
    return f"rm -rf -- {' '.join(paths)}" if paths else "true"
