"""Import SGLang 0.5.23's Triton attention kernels without SGLang's package __init__ (which pulls in the whole
server and its CUDA wheel). The wheel is unpacked with `pip install --no-deps --target DIR`; the few modules the
kernel files import from are registered here as light stand-ins before the kernel modules load."""

from __future__ import annotations

import importlib
import sys
import types
from pathlib import Path
from typing import Any

PACKAGES = ("sglang", "sglang.srt", "sglang.kernels", "sglang.kernels.ops", "sglang.kernels.ops.attention")


class _DisabledFlags:
    """Stand-in for sglang.srt.environ.envs: every SGLANG_* flag reads as unset/False."""

    def __getattr__(self, name: str) -> Any:
        return types.SimpleNamespace(get=lambda: False, value=False)


def _register_stand_ins(site: Path) -> None:
    import torch

    for name in PACKAGES:
        if name in sys.modules:
            continue
        pkg = types.ModuleType(name)
        pkg.__path__ = [str(site.joinpath(*name.split(".")))]
        sys.modules[name] = pkg
    environ = types.ModuleType("sglang.srt.environ")
    environ.envs = _DisabledFlags()  # type: ignore[attr-defined]
    utils = types.ModuleType("sglang.srt.utils")
    utils.is_cuda = lambda: True  # type: ignore[attr-defined]
    for flag in ("is_hip", "is_gfx95_supported", "is_gfx1250_supported", "is_npu", "is_cpu", "is_xpu"):
        setattr(utils, flag, lambda: False)
    utils.next_power_of_2 = lambda n: 1 << max(0, int(n) - 1).bit_length()  # type: ignore[attr-defined]
    utils.get_device_core_count = (  # type: ignore[attr-defined]
        lambda device_id=0: torch.cuda.get_device_properties(device_id).multi_processor_count
    )
    sys.modules.setdefault("sglang.srt.environ", environ)
    sys.modules.setdefault("sglang.srt.utils", utils)


def load_sglang_attention(site: str | Path) -> tuple[types.ModuleType, types.ModuleType | None]:
    """(extend_attention module, verify_mla module or None) from an unpacked sglang wheel at ``site``."""
    site = Path(site)
    if not (site / "sglang" / "kernels" / "ops" / "attention" / "extend_attention.py").is_file():
        raise FileNotFoundError(f"no sglang wheel unpacked at {site} (pip install --no-deps --target {site})")
    if str(site) not in sys.path:
        sys.path.insert(0, str(site))
    _register_stand_ins(site)
    extend = importlib.import_module("sglang.kernels.ops.attention.extend_attention")
    try:
        verify = importlib.import_module("sglang.kernels.ops.attention.verify_mla")
    except ImportError:
        verify = None
    return extend, verify
