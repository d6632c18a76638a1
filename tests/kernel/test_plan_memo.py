"""The op memoises its launch plans (kdtree_kernel.ops._plan): the backend asks for the same plan in every layer of
a step, and planning is 75-235 us of Python. A memoised plan must be the planner's own, for exactly the sizes,
device figures and row-group limit it was asked for."""

from __future__ import annotations

import itertools

import pytest
from kdtree_kernel.ops import _plan, _row_groups
from kdtree_kernel.plan import plan_launch

SIZES = list(itertools.product((1, 3, 64), (1, 9, 64), (8, 16), (0, 1000, 131072)))


def test_memoised_plans_are_the_planners() -> None:
    for bs, q_len, heads, prefix in SIZES:
        for sms, per_sm, groups, fixed in (
            (132, 1, 3, False),
            (188, 1, 3, False),
            (132, 1, 3, True),
            (132, 2, 1, True),
        ):
            got = _plan(bs, q_len, heads, prefix, sms, per_sm, groups, fixed)
            want = plan_launch(
                bs,
                q_len,
                heads,
                prefix,
                num_sms=sms,
                blocks_per_sm=per_sm,
                max_row_groups=groups,
                fixed_row_groups=fixed,
            )
            assert got == want, (bs, q_len, heads, prefix, sms, per_sm, groups, fixed)


def test_a_repeated_request_is_served_from_the_memo() -> None:
    _plan.cache_clear()
    first = _plan(1, 9, 8, 8192, 132, 1, 3)
    assert _plan(1, 9, 8, 8192, 132, 1, 3) is first
    info = _plan.cache_info()
    assert (info.hits, info.misses) == (1, 1)


def test_every_argument_is_part_of_the_key() -> None:
    base = (1, 9, 8, 8192, 132, 1, 3)
    plan = _plan(*base)
    # The fp8 pool's 16-row blocks (max_row_groups 1) and another GPU's SM count plan differently.
    assert _plan(*base[:6], 1).row_groups == 1 != plan.row_groups
    assert _plan(*base[:4], 188, 1, 3).splits != plan.splits
    assert _plan(1, 9, 8, 1024, 132, 1, 3).chunk_keys != plan.chunk_keys
    assert _plan(*base, True).row_groups == 3 != plan.row_groups  # fixed: the fewest blocks


def test_row_group_policy_per_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    """bf16 pools weigh blocks of 16, 32 and 48 rows; KDTREE_ROW_GROUPS=fixed and every fp8 pool take the fewest
    blocks of their kernel (the e4m3 kernel's 16 rows, or the widening path's 48)."""
    monkeypatch.delenv("KDTREE_ROW_GROUPS", raising=False)
    monkeypatch.delenv("KDTREE_FP8_PATH", raising=False)
    assert _row_groups(fp8=False) == (3, False)
    assert _row_groups(fp8=True) == (1, True)
    monkeypatch.setenv("KDTREE_ROW_GROUPS", "fixed")
    assert _row_groups(fp8=False) == (3, True)
    monkeypatch.setenv("KDTREE_FP8_PATH", "widen")
    assert _row_groups(fp8=True) == (3, True)
