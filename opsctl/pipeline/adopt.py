"""``adopt``: record a hand-made install (files under the root + the unit as it is) as release zero, touching
nothing that runs: the unit is not restarted, the original files stay where they are (a copy goes into the
release).

preflight -> inventory files -> layout -> lock -> record"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from ..errors import DeployFailed
from ..host import releaseroot
from ..inventory import HostConfig
from ..lock.hostlock import LockOwner
from ..ssh.session import Connect, default_connect
from .report import Reporter
from .result import DeployResult, DeployVerdict, HistoryEvent, HistoryRecord
from .runner import Run, Step, execute, lock_step
from .steps import snapshot

ADOPT_COPY_LIMIT_MB = 2048


@dataclass
class _Found:
    """What the hand-made install consists of: its files (path -> sha256), their size, the unit's text."""

    files: dict[str, dict[str, str]] = field(default_factory=dict)
    size_mb: int = 0
    unit_text: str = ""
    release: str = ""


def _preflight(run: Run) -> str:
    snap = snapshot(run)
    if snap.is_managed:
        raise DeployFailed(f"{run.host.name} is already managed by opsctl (adopted or deployed); nothing to adopt")
    if snap.is_virgin:
        raise DeployFailed(
            f"{run.host.name} has no unit {run.host.unit} and no {run.host.root}: nothing to adopt, deploy directly"
        )
    return f"unit {snap.unit.load_state}/{snap.unit.active_state}, root {'exists' if snap.root_exists else 'absent'}"


def _inventory(found: _Found) -> Step:
    def run_(run: Run) -> str:
        snap, r = run.snap, run.r
        assert snap is not None
        listing = ""
        if snap.root_exists:
            listing = r.run(releaseroot.foreign_files_command(run.host.root), timeout=1800).stdout
            du = r.run(
                releaseroot.size_mb_command(run.host.root, snap.other_root_entries), timeout=600, check=False
            ).stdout.split()
            found.size_mb = int(du[0]) if du and du[0].isdigit() else 0
        found.unit_text = r.read_file(snap.unit.fragment_path).decode() if snap.unit.fragment_path else ""
        for line in filter(None, listing.split("\n")):
            digest, _, path = line.partition("  ")
            found.files[path.removeprefix("./")] = {"sha256": digest}
        h = hashlib.sha256(json.dumps({"files": found.files, "unit": found.unit_text}, sort_keys=True).encode())
        found.release = run.result.release = run.result.current_after = "r0-" + h.hexdigest()[:12]
        return (
            f"{len(found.files)} files ({found.size_mb} MB), unit {snap.unit.fragment_path or 'absent'} "
            f"-> release {found.release}"
        )

    return Step("inventory files", run_)


def _record(found: _Found) -> Step:
    def run_(run: Run) -> str:
        snap, r, host = run.snap, run.r, run.host
        assert snap is not None
        rid = found.release
        rel = run.layout.release(rid)
        copied = bool(snap.other_root_entries) and found.size_mb <= ADOPT_COPY_LIMIT_MB
        r.run(["mkdir", "-p", f"{rel}/files"], timeout=60)
        if copied:
            r.run(
                ["cp", "-a", "--", *(f"{host.root}/{e}" for e in snap.other_root_entries), f"{rel}/files/"],
                timeout=1800,
            )
        if found.unit_text:
            # 0600: a hand-edited unit may carry a token inline (it should move to the EnvironmentFile).
            r.write_file(f"{rel}/unit.service", found.unit_text.encode(), mode=0o600)
        manifest: dict[str, Any] = {
            "format": 1,
            "id": rid,
            "adopted": True,
            "created_at": releaseroot.utc_now(),
            "created_by": LockOwner.mine("adopt").user,
            "root": host.root,
            "files": found.files,
            "copied": copied,
            "unit": {
                "path": snap.unit.fragment_path,
                "sha256": hashlib.sha256(found.unit_text.encode()).hexdigest(),
                "drop_ins": snap.unit.drop_in_paths,
                "active": snap.unit.active_state,
            },
        }
        r.write_file(f"{rel}/manifest.json", (json.dumps(manifest, indent=1, sort_keys=True) + "\n").encode())
        releaseroot.switch_current(r, run.layout, rid)
        releaseroot.set_last_good(r, run.layout, rid)
        run.record(
            HistoryRecord(
                event=HistoryEvent.ADOPT,
                release=rid,
                verdict=DeployVerdict.ADOPTED,
                unit=snap.unit.fragment_path,
                files=len(found.files),
            )
        )
        run.conclude(DeployVerdict.ADOPTED, "recorded as release zero; nothing restarted")
        if copied:
            return f"copied {found.size_mb} MB"
        return "recorded (files too large to copy)" if snap.other_root_entries else "unit only"

    return Step("record", run_, detail=lambda run: run.layout.release(found.release))


def adopt(host: HostConfig, reporter: Reporter | None = None, *, connect: Connect = default_connect) -> DeployResult:
    """Record a hand-made install as release zero (the rollback target); nothing that runs is touched."""
    found = _Found()
    steps = [
        Step("preflight", _preflight),
        _inventory(found),
        Step("layout", lambda run: releaseroot.ensure_layout(run.r, run.layout, adopted=True), shown=False),
        lock_step(lambda run: f"adopt {found.release}"),
        _record(found),
    ]
    with Run.open(host, HistoryEvent.ADOPT, reporter, connect) as run:
        return execute(run, steps)
