"""The health probe's read-only look at a host, run on the host (docs/gate.md "Health checks").

opsctl ships this file's text to the host as ``python3 - INVOCATION_ID``, the text on stdin with the configuration
written into its ``CONFIG_TEXT`` line (:func:`opsctl.health.probe.probe_command`, ``probe_payload``;
opsctl/ssh/hostprogram.py), after the host facts and the probe's separator: the host needs only its own python3,
not the service's venv. The configuration holds ``unit``, ``root``, ``http_url`` (null in replay mode),
``http_timeout``, ``window`` (seconds of journal to read), ``max_lines``, ``max_hash_bytes`` and ``marker`` (the
backend's line marker: this program cannot import ``kdtree_backend.wire`` or opsctl, where it is defined).
INVOCATION_ID (argv[1], may be empty) is the unit's current invocation, from the facts printed before.

It prints one JSON document on stdout, read by :func:`opsctl.health.probe.facts_from_probe`::

    {"host_time", "http": {"status" | "error", "elapsed_s"}, "release", "hashes": {path: sha256 | "too-large"},
     "manifest" | "manifest_error" | "release_error", "parity_lines": [[epoch_s, message]] | "journal_error",
     "parity_env", "lock": {"age_s", "text"}}

(a key is absent when it does not apply: no ``http`` without an URL, no ``parity_lines`` without an invocation, no
``lock`` when none is held).

Kept to the standard library and to the Python of older hosts (3.10, as opsctl/probe/traffic_on_host.py): no
third-party import, no match statement.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from typing import Any

COMMAND_TIMEOUT_S = 20
ERROR_TEXT_MAX = 200
JOURNAL_ERROR_MAX = 300
MANIFEST_MAX_CHARS = 4 << 20
SMALL_FILE_MAX_CHARS = 4096  # parity.env, the lock's owner record
HASH_CHUNK = 1 << 20
# kdtree_backend.wire.LEFT_OUT (this program imports nothing of the release; tests/journal pins the two): what a
# message journalctl did not print is handed on as, so the health check fails it instead of skipping it.
LEFT_OUT = "[kdtree] <a message journalctl left out>"
SKIPPED_DIRS = ("__pycache__",)  # written by the service's own imports: never part of a release's manifest


def run(argv: list[str], timeout: float = COMMAND_TIMEOUT_S) -> tuple[int, str, str]:
    """(exit status, stdout, stderr); 127 when the program is missing, 124 when it ran past ``timeout``."""
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
        return r.returncode, r.stdout, r.stderr
    except FileNotFoundError:
        return 127, "", argv[0] + ": not found"
    except subprocess.TimeoutExpired:
        return 124, "", argv[0] + ": timed out"


def http_facts(url: str, timeout: float) -> dict[str, Any]:
    """One GET of the service's health endpoint: its status (an HTTP error is a status too), or why none came."""
    t0 = time.monotonic()
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return {"status": r.status, "elapsed_s": time.monotonic() - t0}
    except urllib.error.HTTPError as e:
        return {"status": e.code, "elapsed_s": time.monotonic() - t0}
    except Exception as e:  # any failure to ask is a finding, never a crash of the probe
        return {"error": type(e).__name__ + ": " + str(e)[:ERROR_TEXT_MAX], "elapsed_s": time.monotonic() - t0}


def sha256_of(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(HASH_CHUNK), b""):
            h.update(chunk)
    return h.hexdigest()


def hash_tree(base: str, max_hash_bytes: int) -> dict[str, str]:
    """Relative path -> sha256 of every regular file under ``base`` (no symlink, not manifest.json itself, nothing
    under ``__pycache__``); a file over ``max_hash_bytes`` is ``"too-large"`` rather than read."""
    hashes: dict[str, str] = {}
    for d, dirs, files in os.walk(base):
        dirs[:] = sorted(x for x in dirs if x not in SKIPPED_DIRS)
        for f in files:
            full = os.path.join(d, f)
            rel = os.path.relpath(full, base)
            if os.path.islink(full) or not os.path.isfile(full) or rel == "manifest.json":
                continue
            hashes[rel] = "too-large" if os.path.getsize(full) > max_hash_bytes else sha256_of(full)
    return hashes


def release_facts(root: str, max_hash_bytes: int) -> dict[str, Any]:
    """The current release: its id, its files' hashes and its manifest's text (``manifest_error`` when that cannot
    be read); ``release_error`` when there is no current release or its files cannot be read."""
    found: dict[str, Any] = {}
    cur = os.path.join(root, "current")
    try:
        found["release"] = os.path.basename(os.readlink(cur).rstrip("/"))
        base = os.path.realpath(cur)
        found["hashes"] = hash_tree(base, max_hash_bytes)
        try:
            with open(os.path.join(base, "manifest.json")) as fh:
                found["manifest"] = fh.read(MANIFEST_MAX_CHARS)
        except OSError as e:
            found["manifest_error"] = str(e)
    except OSError as e:
        found["release_error"] = str(e)
    return found


def journal_argv(unit: str, invocation: str, window_s: float) -> list[str]:
    """journalctl for the messages of one invocation of ``unit`` in the last ``window_s`` seconds, as JSON lines."""
    return [
        "journalctl",
        "-u",
        unit,
        "_SYSTEMD_INVOCATION_ID=" + invocation,
        "--since",
        f"-{int(window_s)}s",
        "-o",
        "json",
        "--all",  # without it a message of 4096 bytes or more comes as null: a long parity line never seen
        "--output-fields=MESSAGE,_LINE_BREAK",  # a message journald cut: judged as a piece (gate.decision.judge)
        "--no-pager",
        "-q",
    ]


def parity_lines(journal_json: str, marker: str, max_lines: int) -> list[list[Any]]:
    """journalctl's JSON lines -> the last ``max_lines`` [epoch seconds, message] whose message holds ``marker``, and
    every message journald cut (``_LINE_BREAK``: [epoch seconds, message, why], the reader judges the piece).
    A line that is not JSON is skipped; a message journald stored as bytes (a list of ints) is decoded; a MESSAGE
    that is null (journalctl left it out) is :data:`LEFT_OUT`, kept and failed by the reader, never skipped."""
    lines: list[list[Any]] = []
    # One entry per \n: journalctl prints U+2028 raw inside a JSON string, which str.splitlines() would cut.
    for raw in journal_json.split("\n"):
        try:
            e = json.loads(raw)
        except ValueError:
            continue
        if not isinstance(e, dict):
            continue
        m = e.get("MESSAGE", "")
        if isinstance(m, list) and all(isinstance(v, int) and 0 <= v <= 255 for v in m):
            m = bytes(m).decode("utf-8", "replace")
        elif not isinstance(m, str):
            m = f"{LEFT_OUT}: MESSAGE {'null' if m is None else 'not text'} in journalctl's JSON"
        cut = e.get("_LINE_BREAK")
        if isinstance(m, str) and (marker in m or cut is not None):
            at = int(e.get("__REALTIME_TIMESTAMP", "0")) / 1e6
            lines.append([at, m] if cut is None else [at, m, cut if isinstance(cut, str) and cut else "?"])
    return lines[-max_lines:]


def journal_facts(cfg: dict[str, Any], invocation: str) -> dict[str, Any]:
    """``parity_lines`` of the running invocation, or ``journal_error`` when journalctl failed."""
    rc, so, se = run(journal_argv(cfg["unit"], invocation, cfg["window"]))
    if rc != 0:
        return {"journal_error": (se.strip() or f"journalctl exited {rc}")[-JOURNAL_ERROR_MAX:]}
    return {"parity_lines": parity_lines(so, cfg["marker"], cfg["max_lines"])}


def lock_facts(root: str) -> dict[str, Any] | None:
    """The deploy lock (a directory with owner.json, or an older plain file): its age and its owner record's
    text; None when no lock is held."""
    lock = os.path.join(root, "state", "lock")
    if not os.path.lexists(lock):
        return None
    info: dict[str, Any] = {"age_s": time.time() - os.lstat(lock).st_mtime, "text": ""}
    try:
        with open(os.path.join(lock, "owner.json") if os.path.isdir(lock) else lock, errors="replace") as fh:
            info["text"] = fh.read(SMALL_FILE_MAX_CHARS)
    except OSError as e:
        info["text"] = "unreadable: " + str(e)
    return info


def probe(cfg: dict[str, Any], invocation: str) -> dict[str, Any]:
    """Everything the probe looks at, in the order it looks."""
    out: dict[str, Any] = {"host_time": time.time()}
    if cfg["http_url"]:
        out["http"] = http_facts(cfg["http_url"], cfg["http_timeout"])
    root = cfg["root"]
    out.update(release_facts(root, cfg["max_hash_bytes"]))
    if invocation:
        out.update(journal_facts(cfg, invocation))
    try:
        with open(os.path.join(root, "state", "parity.env")) as fh:
            out["parity_env"] = fh.read(SMALL_FILE_MAX_CHARS)
    except OSError:
        pass  # no token handed out: the parity check then counts every line
    lock = lock_facts(root)
    if lock is not None:
        out["lock"] = lock
    return out


def main(config_text: str, argv: list[str]) -> int:
    """The configuration's JSON text and the invocation (``argv[1]``) -> the document printed, exit 0."""
    cfg = json.loads(config_text)
    print(json.dumps(probe(cfg, argv[1] if len(argv) > 1 else "")))
    return 0


# opsctl replaces this line with the configuration (JSON text, as a string literal) when it ships the program on
# stdin (opsctl/ssh/hostprogram.py: HostProgram.payload): nothing of it in argv, where `ps` shows it.
CONFIG_TEXT: str | None = None

if __name__ == "__main__":
    # By hand: `python3 probe_on_host.py INVOCATION_ID < config.json`.
    sys.exit(main(CONFIG_TEXT if CONFIG_TEXT is not None else sys.stdin.read(), sys.argv))
