"""The release root's history (``<root>/state/history.jsonl``): one JSON line per deploy, restart, rollback and
gate verdict, appended in one write and read back for ``releases``, ``status`` and the rollback target."""

from __future__ import annotations

import json
from typing import Any

from ..ssh.remote import Remote
from .releaseroot import Layout, append_history_command, read_history_command, utc_now


def append_history(r: Remote, layout: Layout, record: dict[str, Any]) -> None:
    """One JSON line per event; one small append (< PIPE_BUF) so concurrent readers never see half a line."""
    line = json.dumps({"at": utc_now(), **record}, sort_keys=True, default=str)
    r.run(append_history_command(layout, line), timeout=60)


def parse_history(text: str) -> list[dict[str, Any]]:
    out = []
    for line in text.splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue  # a torn last line after a power cut is skipped, not fatal
        if isinstance(rec, dict):
            out.append(rec)
    return out


def read_history(r: Remote, layout: Layout) -> list[dict[str, Any]]:
    res = r.run(read_history_command(layout), timeout=60)
    return parse_history(res.stdout)


def release_verdicts(history: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Latest gate record per release (for `releases` and `status`)."""
    out: dict[str, dict[str, Any]] = {}
    for rec in history:
        rid = rec.get("release")
        if isinstance(rid, str) and rec.get("verdict"):
            out[rid] = rec
    return out
