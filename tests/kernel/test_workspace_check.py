"""The op refuses a bad workspace in Python, before the launch (kdtree_kernel.ops.check_workspace): a failed
check inside the extension killed the process on the GPU machine instead of raising. CPU tensors stand in for
device ones (the check reads only size, layout and address)."""

from __future__ import annotations

import pytest
import torch
from kdtree_kernel.ops import WORKSPACE_ALIGN, check_workspace
from kdtree_kernel.plan import plan_launch


def planned_bytes() -> int:
    need = plan_launch(1, 9, 8, 8192, num_sms=132).workspace_bytes
    assert need > 0, "bs 1 x 8k splits its keys, so it needs a workspace"
    return need


def test_right_sized_aligned_workspace_passes() -> None:
    need = planned_bytes()
    check_workspace(torch.empty(need, dtype=torch.uint8), need)
    check_workspace(torch.empty(need // 4 + 1, dtype=torch.float32), need)  # any dtype: bytes count


def test_too_small_workspace_is_refused() -> None:
    need = planned_bytes()
    with pytest.raises(ValueError, match="too small"):
        check_workspace(torch.empty(need - 1, dtype=torch.uint8), need)


def test_misaligned_workspace_is_refused() -> None:
    need = planned_bytes()
    padded = torch.empty(need + 2 * WORKSPACE_ALIGN, dtype=torch.uint8)
    start = -padded.data_ptr() % WORKSPACE_ALIGN  # first aligned byte
    check_workspace(padded[start:], need)
    with pytest.raises(ValueError, match="aligned"):
        check_workspace(padded[start + 8 :], need)


def test_strided_workspace_is_refused() -> None:
    need = planned_bytes()
    with pytest.raises(ValueError, match="contiguous"):
        check_workspace(torch.empty(2 * need, dtype=torch.uint8)[::2], need)
