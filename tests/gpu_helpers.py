"""What the GPU tests of tests/kernel and tests/backend share: the marks that select them (``-m gpu``) and skip
them, saying why, where there is no CUDA GPU or no built extension, and the device buffers they all allocate.

Imported as ``tests.gpu_helpers``: the repository root is on ``sys.path`` (tests/conftest.py, and
kernel/bench/run_device.sh's PYTHONPATH where it runs ``pytest --noconftest``). Needs torch and kdtree_kernel,
neither opsctl nor SGLang, so it imports on a bare GPU machine.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import pytest
import torch
from kdtree_kernel import extension_available, workspace_size

NO_CUDA = "needs a CUDA GPU"
NO_EXTENSION = "kdtree_verify_ext not built (deploy/build_extension.py; set KDTREE_EXT_DIR)"
VALUE_DIM = 512  # the kernel's output columns per (token, head)

# A GPU test: selected by -m gpu, skipped without CUDA.
NEEDS_CUDA = (pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_CUDA))
# A GPU test of the built extension: also skipped (with how to build it) where CUDA is there but the module is not.
NEEDS_EXTENSION = (
    *NEEDS_CUDA,
    pytest.mark.skipif(torch.cuda.is_available() and not extension_available(), reason=NO_EXTENSION),
)

F = TypeVar("F", bound=Callable[..., None])


def extension_test(fn: F) -> F:
    """NEEDS_EXTENSION on one test, for a module whose other tests run everywhere."""
    for mark in NEEDS_EXTENSION:
        fn = mark(fn)
    return fn


def require_kernel() -> None:
    """Skip unless the backend would use the kernel on this GPU (built, loadable, and computing right here)."""
    from kdtree_backend.verify import kernel_usable

    usable, reason = kernel_usable(torch.device("cuda"))
    if not usable:
        pytest.skip(f"kdtree CUDA extension not usable here ({reason}): build it with deploy/build_extension.py")


def nan_outputs(tokens: int, heads: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse) for a kernel call, filled with NaN so that an element the kernel did not write shows."""
    out = torch.full((tokens, heads, VALUE_DIM), float("nan"), dtype=torch.bfloat16, device="cuda")
    lse = torch.full((tokens, heads), float("nan"), dtype=torch.float32, device="cuda")
    return out, lse


def workspace(bs: int, q_len: int, heads: int, max_prefix: int, *, fp8: bool = False) -> torch.Tensor:
    """The split-KV workspace a launch of this shape needs (at least one byte: the binding wants a buffer)."""
    return torch.empty(max(1, workspace_size(bs, q_len, heads, max_prefix, fp8=fp8)), dtype=torch.uint8, device="cuda")
