"""opsctl: bundle, ship, build, gate and roll back the kdtree kernel + SGLang backend on GPU hosts."""

from __future__ import annotations


def __getattr__(name: str) -> str:
    """``opsctl.__version__``, read from the installed metadata when first asked (importlib.metadata costs the
    CLI's start otherwise)."""
    if name != "__version__":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from importlib.metadata import PackageNotFoundError, version

    try:
        value = version("kdtree-engine")
    except PackageNotFoundError:  # running from a source tree that was not pip-installed
        value = "0+unknown"
    globals()["__version__"] = value
    return value
