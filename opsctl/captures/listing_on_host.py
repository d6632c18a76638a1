"""What is stored in a host's capture directory, listed on the host (docs/capture.md).

opsctl ships this file's text to the host as ``python3 -``, on stdin, with its configuration ``{"dir", "id_pattern",
"request_file"}`` written into its ``CONFIG_TEXT`` line (:data:`opsctl.captures.capturedir.LISTING_PROGRAM`,
opsctl/ssh/hostprogram.py): the host needs only its own python3, not the service's venv or torch. The capture-id
pattern and the request file's name come in the configuration because this program cannot import
``kdtree_backend.wire`` or opsctl, where they are defined. It prints one JSON document on stdout, read by
:func:`opsctl.captures.listing.parse_listing`::

    {"now": <host clock>, "dir": DIRECTORY, "request": <the request file's JSON or null>,
     "captures": [{"id", "mtime", "bytes", "calls": [{<CALL_KEYS>, "name"}], "done": [<rank done docs>],
                   "partial"}]}

Only directories named by a capture id are listed (not a symlink, not anything else). Inside one, a name starting
with ``.`` is a call or rank file still being written, ``*.done.json`` a rank's finish document and a directory
a call, known by its ``manifest.json`` (a call without a readable one counts as partial too).

Kept to the standard library and to the Python of older hosts (3.10, as opsctl/probe/traffic_on_host.py): no
third-party import, no match statement.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from typing import Any

USAGE = 'usage: python3 - < this program with its configuration {"dir", "id_pattern", "request_file"} (JSON)'
CONFIG_KEYS = ("dir", "id_pattern", "request_file")
EXIT_USAGE = 2
MANIFEST = "manifest.json"
DONE_SUFFIX = ".done.json"
# What a call's manifest tells the operator (``opsctl captures``, ``opsctl capture``); the rest stays on the host.
CALL_KEYS = ("tp", "layer", "step", "release", "bytes", "captured_at", "bs", "q_len", "heads")


def load_json(path: str) -> Any:
    """The JSON in ``path``; None when it cannot be read or is not JSON (a file being written, or damaged)."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def tree_bytes(directory: str) -> int:
    """The size of every file under ``directory`` (symlinks not followed); a file gone meanwhile counts 0."""
    total = 0
    for sub, _dirs, files in os.walk(directory):
        for name in files:
            try:
                total += os.lstat(os.path.join(sub, name)).st_size
            except OSError:
                pass
    return total


def call_entry(manifest: dict[str, Any], name: str) -> dict[str, Any]:
    """One stored call as listed: the manifest's :data:`CALL_KEYS` (None when absent) and its directory name."""
    call = {k: manifest.get(k) for k in CALL_KEYS}
    call["name"] = name
    return call


def capture_entry(directory: str, capture_id: str) -> dict[str, Any]:
    """One capture directory: its mtime and size, its calls, the finish documents of its ranks, and how many
    of its children are still being written (or have no readable manifest)."""
    entry: dict[str, Any] = {
        "id": capture_id,
        "mtime": os.lstat(directory).st_mtime,
        "bytes": tree_bytes(directory),
        "calls": [],
        "done": [],
        "partial": 0,
    }
    for child in sorted(os.listdir(directory)):
        path = os.path.join(directory, child)
        if child.startswith("."):
            entry["partial"] += 1
        elif child.endswith(DONE_SUFFIX):
            doc = load_json(path)
            if isinstance(doc, dict):
                entry["done"].append(doc)
        elif os.path.isdir(path):
            manifest = load_json(os.path.join(path, MANIFEST))
            if isinstance(manifest, dict):
                entry["calls"].append(call_entry(manifest, child))
            else:
                entry["partial"] += 1
    return entry


def is_capture(root: str, name: str, id_re: re.Pattern[str]) -> bool:
    """Whether ``root/name`` is a capture: named by a capture id, a real directory (a symlink is never one)."""
    path = os.path.join(root, name)
    return id_re.fullmatch(name) is not None and os.path.isdir(path) and not os.path.islink(path)


def listing(root: str, id_re: re.Pattern[str], request_file: str, now: float) -> dict[str, Any]:
    """The whole document for ``root``: empty (no request, no captures) when there is no such directory."""
    out: dict[str, Any] = {"now": now, "dir": root, "request": None, "captures": []}
    if os.path.isdir(root):
        out["request"] = load_json(os.path.join(root, request_file))
        for name in sorted(os.listdir(root)):
            if is_capture(root, name, id_re):
                out["captures"].append(capture_entry(os.path.join(root, name), name))
    return out


def main(config_text: str | None) -> int:
    try:
        cfg = json.loads(config_text or "")
        root, pattern, request_file = (str(cfg[k]) for k in CONFIG_KEYS)
    except (ValueError, KeyError, TypeError):
        print(USAGE, file=sys.stderr)
        return EXIT_USAGE
    # The clock is read first, as the listing starts: ages are measured against the host's own time.
    now = time.time()
    print(json.dumps(listing(root, re.compile(pattern), request_file, now)))
    return 0


# opsctl replaces this line with the configuration (JSON text, as a string literal) when it ships the program on
# stdin (opsctl/ssh/hostprogram.py: HostProgram.payload): nothing of it in argv, where `ps` shows it.
CONFIG_TEXT: str | None = None

if __name__ == "__main__":
    # By hand: `python3 listing_on_host.py < config.json`.
    sys.exit(main(CONFIG_TEXT if CONFIG_TEXT is not None else sys.stdin.read()))
