"""A release bundle: what a host runs (see SHIPPED) plus manifest.json, with a content-derived id.

A bundle holds what runs on a host and nothing else: research (benchmarks, profiles, probes, logs under
kernel/bench/ and backend/bench/), tests and docs stay in the repository, so they neither travel to every host nor
change the release id. The rule is SHIPPED below, an allow-list: a new directory ships only once it is named there.

The id hashes (path, sha256, executable bit) of every file and nothing else, so the same tree always gives the
same id, wherever and whenever it is bundled. The manifest adds provenance (source commit and dirty flag,
who/when, opsctl version) that does not take part in the id.
"""

from __future__ import annotations

import datetime as dt
import fnmatch
import getpass
import hashlib
import json
import os
import re
import shutil
import socket
import stat
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from .errors import DeployFailed

# The top-level directories a bundle draws from (the test trees copy these); SHIPPED picks the files within them.
BUNDLE_DIRS = ("kernel", "backend", "deploy", "systemd")
# What a host uses, as path patterns (fnmatch; '*' also matches '/') -> why the host needs it. A file ships when it
# matches one of them; everything else under BUNDLE_DIRS (kernel/bench/, backend/bench/) stays behind.
SHIPPED: dict[str, str] = {
    "kernel/csrc/*": "the CUDA sources deploy/build_extension.py compiles on the host",
    "kernel/kdtree_kernel/*": "the kernel's Python package (the unit's PYTHONPATH holds <release>/kernel)",
    "backend/kdtree_backend/*": "the SGLang backend and the replay service (PYTHONPATH holds <release>/backend)",
    "backend/*.dist-info/*": "the plugin's entry point, through which SGLang finds the backend",
    "deploy/*": "the deploy's own files: build_extension.py and kdtree.json (the backend's KDTREE_CONFIG)",
    "systemd/*": "the unit template each release's unit.service is rendered from",
}
MANIFEST = "manifest.json"
ID_RE = re.compile(r"^r[0-9a-f]{12}$")
ADOPTED_ID_RE = re.compile(r"^r0-[0-9a-f]{12}$")
# Build outputs and caches never travel (the extension is built on the host).
_SKIP_PARTS = {"__pycache__", ".pytest_cache", ".ruff_cache", "build", ".mypy_cache"}
_SKIP_SUFFIXES = (".pyc", ".pyo", ".so", ".o", ".egg-info")


@dataclass(frozen=True)
class FileEntry:
    path: str  # relative, '/'-separated
    sha256: str
    size: int
    executable: bool


@dataclass(frozen=True)
class Manifest:
    id: str
    files: tuple[FileEntry, ...]
    commit: str | None
    dirty: bool | None
    created_by: str
    created_at: str
    opsctl_version: str

    def to_json(self) -> str:
        doc = {
            "format": 1,
            "id": self.id,
            "source": {"commit": self.commit, "dirty": self.dirty},
            "created_by": self.created_by,
            "created_at": self.created_at,
            "opsctl_version": self.opsctl_version,
            "files": {f.path: {"sha256": f.sha256, "size": f.size, "executable": f.executable} for f in self.files},
        }
        return json.dumps(doc, indent=1, sort_keys=True) + "\n"

    @staticmethod
    def from_json(text: str | bytes) -> Manifest:
        doc = json.loads(text)
        files = tuple(
            FileEntry(path=p, sha256=v["sha256"], size=int(v["size"]), executable=bool(v.get("executable")))
            for p, v in sorted(doc["files"].items())
        )
        src = doc.get("source") or {}
        return Manifest(
            id=doc["id"],
            files=files,
            commit=src.get("commit"),
            dirty=src.get("dirty"),
            created_by=doc.get("created_by", "?"),
            created_at=doc.get("created_at", "?"),
            opsctl_version=doc.get("opsctl_version", "?"),
        )

    def checklist(self) -> str:
        """``sha256sum -c`` input for verifying the files on the host."""
        return "".join(f"{f.sha256}  {f.path}\n" for f in self.files)

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)


def default_tree() -> Path:
    """The working tree a bundle is made from when none is named: the checkout holding this opsctl (an editable
    install), else the current directory."""
    here = Path(__file__).resolve().parent.parent
    return here if (here / "kernel").is_dir() and (here / "backend").is_dir() else Path.cwd()


def release_id(files: Iterable[FileEntry]) -> str:
    h = hashlib.sha256()
    for f in sorted(files, key=lambda f: f.path):
        h.update(f"{f.path}\0{f.sha256}\0{int(f.executable)}\n".encode())
    return "r" + h.hexdigest()[:12]


def _skipped(rel: str) -> bool:
    parts = rel.split("/")
    return any(p in _SKIP_PARTS or p.endswith(".egg-info") for p in parts) or rel.endswith(_SKIP_SUFFIXES)


def shipped(rel: str) -> bool:
    """Whether the file at ``rel`` (relative, '/'-separated) belongs in a bundle: SHIPPED names it, and it is not
    a build output or cache."""
    return any(fnmatch.fnmatchcase(rel, pattern) for pattern in SHIPPED) and not _skipped(rel)


def list_files(src_root: Path) -> list[str]:
    """The bundle's files: what git knows under BUNDLE_DIRS (tracked + untracked, not ignored), else a walk;
    of those, the ones SHIPPED names."""
    try:
        out = subprocess.run(
            [
                "git",
                "-C",
                str(src_root),
                "ls-files",
                "-z",
                "--cached",
                "--others",
                "--exclude-standard",
                "--",
                *BUNDLE_DIRS,
            ],
            capture_output=True,
            check=True,
            timeout=60,
        ).stdout.decode()
        names = [n for n in out.split("\0") if n]
        # Deleted-but-tracked files are listed by --cached; keep only what exists.
        rels = [n for n in names if (src_root / n).is_file() and not (src_root / n).is_symlink()]
    except (OSError, subprocess.CalledProcessError, subprocess.TimeoutExpired):
        rels = []
        for top in BUNDLE_DIRS:
            for dirpath, dirnames, filenames in os.walk(src_root / top):
                dirnames[:] = [d for d in dirnames if d not in _SKIP_PARTS and not d.startswith(".")]
                for name in filenames:
                    p = Path(dirpath) / name
                    if p.is_file() and not p.is_symlink():
                        rels.append(p.relative_to(src_root).as_posix())
    return sorted({r for r in rels if shipped(r)})


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _git(src_root: Path, *args: str, strip: bool = True) -> str | None:
    try:
        out = subprocess.run(
            ["git", "-C", str(src_root), *args], capture_output=True, check=True, text=True, timeout=30
        ).stdout
        return out.strip() if strip else out
    except (OSError, subprocess.CalledProcessError, subprocess.TimeoutExpired):
        return None


def _changed_since_commit(src_root: Path) -> list[str] | None:
    """Paths under BUNDLE_DIRS that differ from the commit (modified, added, deleted, untracked; both sides of a
    rename), or None when git cannot tell. Only the shipped ones make a bundle dirty: a bench edit does not."""
    out = _git(src_root, "status", "--porcelain", "-z", "--untracked-files=all", "--", *BUNDLE_DIRS, strip=False)
    if out is None:
        return None
    fields = out.split("\0")
    paths = []
    i = 0
    while i < len(fields):
        entry = fields[i]
        i += 1
        if len(entry) < 4:
            continue
        paths.append(entry[3:])
        if "R" in entry[:2] or "C" in entry[:2]:  # -z puts a rename's source in the next field
            paths.append(fields[i])
            i += 1
    return paths


def opsctl_version() -> str:
    try:
        from importlib.metadata import version

        return version("kdtree-engine")
    except Exception:  # not installed as a distribution
        return "0+unknown"


def make_manifest(src_root: Path, *, now: dt.datetime | None = None, who: str | None = None) -> Manifest:
    rels = list_files(src_root)
    missing = [d for d in ("kernel", "backend") if not any(r.startswith(d + "/") for r in rels)]
    if missing:
        raise DeployFailed(f"{src_root}: no files under {', '.join(missing)}/: is this the kdtree-engine tree?")
    entries = []
    for rel in rels:
        p = src_root / rel
        st = p.stat()
        entries.append(FileEntry(rel, _sha256(p), st.st_size, bool(st.st_mode & stat.S_IXUSR)))
    commit = _git(src_root, "rev-parse", "HEAD")
    changed = _changed_since_commit(src_root) if commit else None
    when = (now or dt.datetime.now(dt.UTC)).strftime("%Y-%m-%dT%H:%M:%SZ")
    return Manifest(
        id=release_id(entries),
        files=tuple(entries),
        commit=commit,
        dirty=any(shipped(p) for p in changed) if changed is not None else None,
        created_by=who or f"{getpass.getuser()}@{socket.gethostname()}",
        created_at=when,
        opsctl_version=opsctl_version(),
    )


def stage(src_root: Path, manifest: Manifest, dest: Path) -> Path:
    """Copy the manifest's files (mtimes kept, so rsync's quick check and --link-dest work) plus manifest.json."""
    dest.mkdir(parents=True, exist_ok=True)
    for f in manifest.files:
        target = dest / f.path
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src_root / f.path, target)
        if _sha256(target) != f.sha256:
            raise DeployFailed(f"{f.path} changed while bundling; try again")
    (dest / MANIFEST).write_text(manifest.to_json())
    return dest
