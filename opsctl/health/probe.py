"""The health probe: one command printing the host facts (:mod:`.facts`), :data:`SEPARATOR`, then one JSON
document from a small read-only Python script (:data:`PROBE_SCRIPT`, run by the host's own python3) with what the
facts do not cover: the health endpoint, the current release's files against its manifest, the current
invocation's ``[kdtree]`` lines, the parity token file, the lock, and the host's clock."""

from __future__ import annotations

import json
import shlex
import urllib.parse
from dataclasses import dataclass
from typing import Any

from ..host.facts import facts_command

SEPARATOR = "--- opsctl health probe ---"
MAX_PARITY_LINES = 2000
MAX_HASH_BYTES = 512 << 20

# argv[1]: the parameters as JSON; argv[2]: the unit's InvocationID (from the facts printed before it).
PROBE_SCRIPT = r"""
import hashlib, json, os, subprocess, sys, time, urllib.request
p = json.loads(sys.argv[1])
inv = sys.argv[2] if len(sys.argv) > 2 else ""
out = {"host_time": time.time()}

def run(argv, timeout=20):
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
        return r.returncode, r.stdout, r.stderr
    except FileNotFoundError:
        return 127, "", argv[0] + ": not found"
    except subprocess.TimeoutExpired:
        return 124, "", argv[0] + ": timed out"

if p["http_url"]:
    t0 = time.monotonic()
    try:
        with urllib.request.urlopen(p["http_url"], timeout=p["http_timeout"]) as r:
            out["http"] = {"status": r.status, "elapsed_s": time.monotonic() - t0}
    except urllib.error.HTTPError as e:
        out["http"] = {"status": e.code, "elapsed_s": time.monotonic() - t0}
    except Exception as e:
        out["http"] = {"error": type(e).__name__ + ": " + str(e)[:200], "elapsed_s": time.monotonic() - t0}

root = p["root"]
cur = os.path.join(root, "current")
try:
    target = os.readlink(cur)
    out["release"] = os.path.basename(target.rstrip("/"))
    base = os.path.realpath(cur)
    hashes = {}
    for d, dirs, files in os.walk(base):
        dirs[:] = sorted(x for x in dirs if x not in ("__pycache__",))
        for f in files:
            full = os.path.join(d, f)
            rel = os.path.relpath(full, base)
            if os.path.islink(full) or not os.path.isfile(full) or rel == "manifest.json":
                continue
            if os.path.getsize(full) > p["max_hash_bytes"]:
                hashes[rel] = "too-large"
                continue
            h = hashlib.sha256()
            with open(full, "rb") as fh:
                for chunk in iter(lambda: fh.read(1 << 20), b""):
                    h.update(chunk)
            hashes[rel] = h.hexdigest()
    out["hashes"] = hashes
    try:
        with open(os.path.join(base, "manifest.json")) as fh:
            out["manifest"] = fh.read(4 << 20)
    except OSError as e:
        out["manifest_error"] = str(e)
except OSError as e:
    out["release_error"] = str(e)

if inv:
    argv = ["journalctl", "-u", p["unit"], "_SYSTEMD_INVOCATION_ID=" + inv, "--since", "-%ds" % p["window"],
            "-o", "json", "--output-fields=MESSAGE", "--no-pager", "-q"]
    rc, so, se = run(argv)
    if rc != 0:
        out["journal_error"] = (se.strip() or "journalctl exited %d" % rc)[-300:]
    else:
        lines = []
        for l in so.splitlines():
            try:
                e = json.loads(l)
            except ValueError:
                continue
            m = e.get("MESSAGE")
            if isinstance(m, list):
                m = bytes(m).decode("utf-8", "replace")
            if isinstance(m, str) and "[kdtree]" in m:
                lines.append([int(e.get("__REALTIME_TIMESTAMP", "0")) / 1e6, m])
        out["parity_lines"] = lines[-p["max_lines"]:]

try:
    with open(os.path.join(root, "state", "parity.env")) as fh:
        out["parity_env"] = fh.read(4096)
except OSError:
    pass

lock = os.path.join(root, "state", "lock")
if os.path.lexists(lock):
    info = {"age_s": time.time() - os.lstat(lock).st_mtime, "text": ""}
    try:
        with open(os.path.join(lock, "owner.json") if os.path.isdir(lock) else lock, errors="replace") as fh:
            info["text"] = fh.read(4096)
    except OSError as e:
        info["text"] = "unreadable: " + str(e)
    out["lock"] = info
print(json.dumps(out))
"""


@dataclass(frozen=True)
class ProbeParams:
    unit: str  # without .service
    root: str
    http_url: str | None  # None: no HTTP endpoint (replay mode)
    http_timeout_s: float
    parity_window_s: float


def health_url(port: int, path: str) -> str:
    """The service's health endpoint on the host itself: ``path`` is the URL's path, never part of its authority
    (a validated path starts with one '/', so it cannot name another host)."""
    return urllib.parse.urlunsplit(("http", f"127.0.0.1:{port}", path, "", ""))


def probe_command(params: ProbeParams, python: str = "python3") -> str:
    """The probe. The host's own python3 runs the script: sglang's venv is not needed for a read-only probe."""
    doc = {
        "unit": params.unit,
        "root": params.root,
        "http_url": params.http_url,
        "http_timeout": params.http_timeout_s,
        "window": params.parity_window_s,
        "max_lines": MAX_PARITY_LINES,
        "max_hash_bytes": MAX_HASH_BYTES,
    }
    invocation = "$(printf '%s\\n' \"$F\" | sed -n 's/^unit\\.InvocationID=//p')"
    return (
        f"F=$({facts_command(params.root, params.unit)}\n); printf '%s\\n' \"$F\"; echo {shlex.quote(SEPARATOR)}; "
        f'{shlex.quote(python)} -c {shlex.quote(PROBE_SCRIPT)} {shlex.quote(json.dumps(doc))} "{invocation}"'
    )


def split_probe_output(stdout: str) -> tuple[str, dict[str, Any]]:
    """The probe's output -> (the facts' text, for parse_facts; the script's JSON). ValueError when the JSON part
    is missing or not an object."""
    facts, sep, rest = stdout.partition(SEPARATOR)
    if not sep:
        raise ValueError("the probe printed no separator (did it run?)")
    doc = json.loads(rest)
    if not isinstance(doc, dict):
        raise ValueError("probe answered something other than a JSON object")
    return facts, doc
