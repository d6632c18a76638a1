"""opsctl: bundle, ship, build, gate and roll back the kdtree kernel + SGLang backend on GPU hosts."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _version

try:
    __version__ = _version("kdtree-engine")
except PackageNotFoundError:  # running from a source tree that was not pip-installed
    __version__ = "0+unknown"
