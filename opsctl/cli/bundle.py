"""``opsctl bundle [--list] [--json]``: the release a deploy of this tree would ship (its id, and with --list its
files and their sizes), computed here by the same code a deploy uses (opsctl/release.py), without connecting
anywhere. Exit 0; 30, as a deploy of it would, when the tree is not a kdtree-engine tree."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape

from . import common

if TYPE_CHECKING:
    from ..release import Manifest


def _kib(size: int) -> str:
    return f"{size / 1024:.1f} KiB"


def _source(manifest: Manifest) -> str:
    if manifest.commit is None:
        return "not a git checkout"
    return f"commit {manifest.commit[:12]}" + (", with uncommitted changes to shipped files" if manifest.dirty else "")


def _as_json(tree: Path, manifest: Manifest, with_files: bool) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "id": manifest.id,
        "tree": str(tree),
        "source": {"commit": manifest.commit, "dirty": manifest.dirty},
        "file_count": len(manifest.files),
        "total_bytes": manifest.total_bytes,
    }
    if with_files:
        doc["files"] = [
            {"path": f.path, "size": f.size, "sha256": f.sha256, "executable": f.executable} for f in manifest.files
        ]
    return doc


app = typer.Typer()


@app.command("bundle")
@common.bounded
def bundle(
    list_files: Annotated[bool, typer.Option("--list", help="also list the files it ships, with sizes")] = False,
    src: Annotated[Path | None, typer.Option("--src", help="working tree to bundle (default: this checkout)")] = None,
    as_json: common.JsonOption = False,
) -> None:
    """The release id a deploy of the working tree would ship (with --list, its files), without connecting
    anywhere. Benchmarks, tests and docs are not part of it (docs/release-layout.md)."""
    from ..release import default_tree, make_manifest

    tree = (src or default_tree()).resolve()
    manifest = make_manifest(tree)
    if as_json:
        common.emit_json(_as_json(tree, manifest, list_files))
        return
    out = common.out
    out.print(manifest.id)
    if list_files:
        width = max(len(f"{f.size:,}") for f in manifest.files)
        for f in manifest.files:
            mark = "  (executable)" if f.executable else ""
            out.print(f"  {f.size:>{width},}  {escape(f.path)}{mark}", soft_wrap=True)
    summary = f"{len(manifest.files)} files, {_kib(manifest.total_bytes)}, from {tree} ({_source(manifest)})"
    common.err.print(f"[dim]{escape(summary)}[/]", soft_wrap=True)
