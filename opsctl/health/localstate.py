"""What health keeps on the machine running opsctl: where its state lives, whole-file writes, and the history of
runs (one JSON line per host and run; the NRestarts baseline of the crash-loop check is read back from it)."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .levels import HostHealth


def write_atomic(path: Path, text: str, mode: int = 0o644) -> None:
    """Write next to the target and rename, so a collector never reads half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def state_dir() -> Path:
    """$OPSCTL_STATE_DIR, else $XDG_STATE_HOME/kdtree-engine, else ~/.local/state/kdtree-engine."""
    explicit = os.environ.get("OPSCTL_STATE_DIR")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_STATE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".local" / "state") / "kdtree-engine"


@dataclass(frozen=True)
class PreviousRun:
    """What the last health run recorded for a host (from the local history)."""

    n_restarts: int | None = None
    invocation_id: str | None = None

    @classmethod
    def from_record(cls, rec: Mapping[str, Any]) -> PreviousRun:
        """One history line (``HostHealth.to_dict``) -> the figures the next run compares with."""
        return cls(n_restarts=rec.get("n_restarts"), invocation_id=rec.get("invocation_id"))


class HealthHistory:
    """Append-only JSON lines, one per host and run. Only the tail is read back (the newest run of each host)."""

    TAIL_BYTES = 1 << 20

    def __init__(self, path: Path | None = None) -> None:
        self.path = path or state_dir() / "health-history.jsonl"

    def latest(self) -> dict[str, dict[str, Any]]:
        try:
            with open(self.path, "rb") as f:
                f.seek(0, os.SEEK_END)
                size = f.tell()
                f.seek(max(0, size - self.TAIL_BYTES))
                data = f.read().decode("utf-8", "replace")
        except FileNotFoundError:
            return {}
        out: dict[str, dict[str, Any]] = {}
        for line in data.splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue  # a torn first line of the tail, or a line cut by a crash
            if isinstance(rec, dict) and isinstance(rec.get("host"), str):
                out[rec["host"]] = rec
        return out

    def previous(self, host: str) -> PreviousRun | None:
        rec = self.latest().get(host)
        return None if rec is None else PreviousRun.from_record(rec)

    def append(self, results: Iterable[HostHealth]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        lines = "".join(json.dumps(r.to_dict(), sort_keys=True) + "\n" for r in results)
        # One write of whole lines in append mode: concurrent runs interleave lines, never halves of them.
        with open(self.path, "a") as f:
            f.write(lines)
