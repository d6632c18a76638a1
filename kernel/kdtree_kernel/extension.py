"""Finding and importing the prebuilt CUDA extension. Never compiles: deploy/build_extension.py builds it."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from types import ModuleType

EXT_NAME = "kdtree_verify_ext"
ENV_DIR = "KDTREE_EXT_DIR"
DEFAULT_BUILD_DIR = Path(__file__).resolve().parent.parent / "build"

_loaded: ModuleType | None = None


class ExtensionNotBuilt(RuntimeError):
    """The compiled kernel module is missing (or failed to import) in every searched directory."""


def candidate_dirs(build_dir: str | os.PathLike[str] | None = None) -> list[Path]:
    """Where the module is looked for, in order: the given dir, $KDTREE_EXT_DIR, kernel/build/."""
    dirs: list[Path] = []
    if build_dir is not None:
        dirs.append(Path(build_dir))
    env = os.environ.get(ENV_DIR)
    if env:
        dirs.append(Path(env))
    dirs.append(DEFAULT_BUILD_DIR)
    return dirs


def find_module_file(dirs: list[Path]) -> Path | None:
    """The first ``kdtree_verify_ext*.so`` in ``dirs`` (searched in order, not recursively)."""
    for directory in dirs:
        if not directory.is_dir():
            continue
        matches = sorted(directory.glob(f"{EXT_NAME}*.so"))
        if matches:
            return matches[0]
    return None


def load_extension(build_dir: str | os.PathLike[str] | None = None) -> ModuleType:
    """Import the prebuilt module (cached after the first success). Raises ExtensionNotBuilt if absent."""
    global _loaded
    if _loaded is not None:
        return _loaded
    dirs = candidate_dirs(build_dir)
    path = find_module_file(dirs)
    if path is None:
        searched = ", ".join(str(d) for d in dirs)
        raise ExtensionNotBuilt(
            f"{EXT_NAME} is not built (searched {searched}). Build it on a CUDA host with "
            f"`python deploy/build_extension.py --arch <cc> --out <dir>` and point {ENV_DIR} at <dir>; "
            "without CUDA use kdtree_kernel.verify_attention_reference."
        )
    import torch  # noqa: F401  (the module links against torch's libraries, loaded by this import)

    spec = importlib.util.spec_from_file_location(EXT_NAME, path)
    if spec is None or spec.loader is None:
        raise ExtensionNotBuilt(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except ImportError as exc:
        raise ExtensionNotBuilt(f"{path} failed to import ({exc}); rebuild it for this torch/CUDA") from exc
    _loaded = module
    return module


def extension_available(build_dir: str | os.PathLike[str] | None = None) -> bool:
    """True when the compiled module imports here. Never raises, never compiles."""
    try:
        load_extension(build_dir)
    except ExtensionNotBuilt:
        return False
    return True
