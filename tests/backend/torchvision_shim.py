"""A stand-in ``torchvision`` for loading SGLang on a CPU machine, installed only when the real one is absent
or does not import (PyPI's torchvision wheels are CUDA builds that fail to load next to a CPU torch).

SGLang 0.5.23 imports torchvision at module level for InternVL image preprocessing (sglang.srt.configs ->
nano_nemotron_vl -> multimodal/internvl_utils), and transformers builds interpolation tables from it when it
looks importable. Neither is on the attention path this repo tests; every attribute of the stand-in is an inert
placeholder class, so a test that actually used torchvision would fail loudly rather than pass silently.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from typing import Any


class _Placeholder(type):
    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _placeholder(name)


def _placeholder(name: str) -> type:
    def refuse(self: object, *args: object, **kwargs: object) -> None:
        raise RuntimeError(f"torchvision stand-in: {name} is not available on this CPU test machine")

    return _Placeholder(name, (), {"__call__": refuse})


class _Module(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _placeholder(name)


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname: str, path: object, target: object = None) -> importlib.machinery.ModuleSpec | None:
        if fullname == "torchvision" or fullname.startswith("torchvision."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = _Module(spec.name)
        module.__path__ = []
        module.__version__ = "0.0.0+kdtree-test-stand-in"  # type: ignore[attr-defined]
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        return None


def install_if_needed() -> bool:
    """Install the stand-in unless a working torchvision imports. Returns True when installed."""
    try:
        import torchvision  # noqa: F401
    except Exception:  # ImportError, or RuntimeError/OSError from a CUDA build's ops
        for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
            del sys.modules[name]
        sys.meta_path.insert(0, _Finder())
        return True
    return False
