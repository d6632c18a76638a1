"""The capture directory on a host (``<root>/state/capture``, docs/capture.md): list, arm, disarm, prune."""

from __future__ import annotations

import shlex
from collections.abc import Iterable

from kdtree_backend.wire import CAPTURE_ID_RE

from ..errors import UsageError

CAPTURE_SUBDIR = "state/capture"
REQUEST_FILE = "request.json"
HOST_CLOCK_COMMAND = "date +%s"

# Runs on the host with its python3 (no torch needed): what is stored, as JSON. argv[1] = the capture directory.
LIST_SCRIPT = r"""
import json, os, re, sys, time
root = sys.argv[1]
out = {"now": time.time(), "dir": root, "request": None, "captures": []}
def load(p):
    try:
        with open(p) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None
if os.path.isdir(root):
    out["request"] = load(os.path.join(root, "request.json"))
    for name in sorted(os.listdir(root)):
        d = os.path.join(root, name)
        if not re.fullmatch(r"c\d{8}T\d{6}Z-[0-9a-f]{6}", name) or not os.path.isdir(d) or os.path.islink(d):
            continue
        entry = {"id": name, "mtime": os.lstat(d).st_mtime, "bytes": 0, "calls": [], "done": [], "partial": 0}
        for sub, dirs, files in os.walk(d):
            for f in files:
                try:
                    entry["bytes"] += os.lstat(os.path.join(sub, f)).st_size
                except OSError:
                    pass
        for child in sorted(os.listdir(d)):
            p = os.path.join(d, child)
            if child.startswith("."):
                entry["partial"] += 1
            elif child.endswith(".done.json"):
                doc = load(p)
                if isinstance(doc, dict):
                    entry["done"].append(doc)
            elif os.path.isdir(p):
                m = load(os.path.join(p, "manifest.json"))
                if isinstance(m, dict):
                    keys = ("tp", "layer", "step", "release", "bytes", "captured_at", "bs", "q_len", "heads")
                    call = {k: m.get(k) for k in keys}
                    call["name"] = child
                    entry["calls"].append(call)
                else:
                    entry["partial"] += 1
        out["captures"].append(entry)
print(json.dumps(out))
"""


def capture_dir(root: str) -> str:
    return f"{root}/{CAPTURE_SUBDIR}"


def check_capture_id(capture_id: str, refusal: str | None = None) -> str:
    """``capture_id`` when it is one; else UsageError (``refusal``, or "bad capture id ...")."""
    if not CAPTURE_ID_RE.fullmatch(capture_id):
        raise UsageError(refusal or f"bad capture id {capture_id!r}")
    return capture_id


def list_command(python: str, directory: str) -> str:
    """What is stored under ``directory``, as one JSON document (:data:`LIST_SCRIPT`)."""
    return f"{shlex.quote(python)} -c {shlex.quote(LIST_SCRIPT)} {shlex.quote(directory)}"


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
