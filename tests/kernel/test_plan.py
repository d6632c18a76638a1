"""Launch planning (pure): the grid covers every row and key, fills the GPU for small batches, stays
capture-safe (chunks cover the planned bound), and sizes the workspace to match."""

from __future__ import annotations

import itertools
import math

import pytest
from kdtree_kernel.plan import (
    BLOCK_N,
    MAX_ROW_GROUPS,
    ROWS_PER_GROUP,
    max_workspace_bytes,
    plan_launch,
    row_tiling,
)

SMS = 132


@pytest.mark.parametrize(("q_len", "heads"), list(itertools.product((1, 2, 9, 16, 33, 64, 128), (8, 16, 64, 128))))
def test_row_tiling_covers_rows_with_bounded_padding(q_len: int, heads: int) -> None:
    groups, blocks = row_tiling(q_len, heads)
    rows = q_len * heads
    assert 1 <= groups <= MAX_ROW_GROUPS
    assert groups * ROWS_PER_GROUP * blocks >= rows
    assert groups * ROWS_PER_GROUP * (blocks - 1) < rows  # no block is entirely padding
    assert blocks == math.ceil(rows / (MAX_ROW_GROUPS * ROWS_PER_GROUP))


@pytest.mark.parametrize(
    ("bs", "prefix", "q_len", "heads"),
    [(1, 0, 9, 8), (1, 1024, 9, 8), (1, 32768, 9, 8), (3, 17, 128, 128), (64, 8192, 9, 8), (128, 4096, 9, 8)],
)
def test_chunks_cover_every_key(bs: int, prefix: int, q_len: int, heads: int) -> None:
    plan = plan_launch(bs, q_len, heads, prefix, num_sms=SMS)
    assert plan.chunk_keys % BLOCK_N == 0
    assert plan.splits * plan.chunk_keys >= prefix + q_len
    assert (plan.splits - 1) * plan.chunk_keys < prefix + q_len  # the last split has work


def test_small_batch_is_split_to_fill_the_gpu() -> None:
    plan = plan_launch(1, 9, 8, 32768, num_sms=SMS)
    assert plan.splits > 1
    blocks = plan.splits * plan.row_blocks
    assert SMS // 2 <= blocks <= SMS


def test_large_batch_is_not_split() -> None:
    plan = plan_launch(64, 9, 8, 8192, num_sms=SMS)
    assert plan.splits == 1
    assert plan.row_groups == MAX_ROW_GROUPS  # the batch fills the GPU: the fewest blocks (each key read twice)
    assert plan.workspace_bytes == 0


def test_short_prefix_needs_no_split() -> None:
    assert plan_launch(1, 9, 8, 0, num_sms=SMS).splits == 1


def test_workspace_matches_partials() -> None:
    plan = plan_launch(2, 9, 8, 20000, num_sms=SMS)
    assert plan.splits > 1
    assert plan.workspace_bytes == 2 * plan.splits * 72 * (512 * 2 + 4)  # bf16 partial rows, fp32 LSEs


def test_more_sms_never_means_fewer_blocks() -> None:
    small = plan_launch(1, 9, 8, 32768, num_sms=66)
    large = plan_launch(1, 9, 8, 32768, num_sms=188)
    assert large.splits >= small.splits


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"bs": 0}, "bs"),
        ({"q_len": 129}, "q_len"),
        ({"q_len": 0}, "q_len"),
        ({"heads": 0}, "heads"),
        ({"max_prefix_len": -1}, "max_prefix_len"),
    ],
)
def test_rejects_bad_sizes(kwargs: dict[str, int], match: str) -> None:
    args = {"bs": 1, "q_len": 9, "heads": 8, "max_prefix_len": 100} | kwargs
    with pytest.raises(ValueError, match=match):
        plan_launch(args["bs"], args["q_len"], args["heads"], args["max_prefix_len"], num_sms=SMS)


@pytest.mark.parametrize(("q_len", "heads", "prefix"), [(9, 8, 131072), (16, 16, 32768), (64, 8, 4096)])
def test_workspace_covers_every_smaller_batch(q_len: int, heads: int, prefix: int) -> None:
    """A graph runner sizes the workspace for max_bs once; each captured bs <= max_bs must fit in it."""
    max_bs = 8
    total = max_workspace_bytes(max_bs, q_len, heads, prefix, num_sms=SMS)
    per_bs = [plan_launch(b, q_len, heads, prefix, num_sms=SMS).workspace_bytes for b in range(1, max_bs + 1)]
    assert total == max(per_bs)
    assert total >= plan_launch(max_bs, q_len, heads, prefix, num_sms=SMS).workspace_bytes


# (bs, prefix, q_len, heads) -> the chunk size timed fastest on the H200 (132 SMs) among 11 sizes from 32 to 4096
# keys, for the fewest blocks that cover the rows (48 rows where there are more; kernel/bench/results/h200/splits.md).
H200_FASTEST_CHUNK = {
    (1, 1024, 9, 8): 32,
    (1, 8192, 9, 8): 128,
    (1, 32768, 9, 8): 512,
    (1, 8192, 64, 8): 704,
    (2, 8192, 9, 8): 256,
    (4, 8192, 9, 8): 544,
    (8, 8192, 9, 8): 1056,
    (8, 32768, 9, 8): 4128,
}


# Cases whose plan the cost model's count of partial bytes (fp32, as fitted, or the bf16 the workspace holds)
# changes -> the chunk of the two plans timed faster on the H200 (kernel/bench/results/h200/partial-bytes.json):
# the bf16 count wins for 48-row blocks within one wave, the fp32 count for smaller blocks and grids past one wave.
H200_FASTER_OF_TWO_CHUNKS = {
    (1, 2048, 9, 8): 32,  # 15.6 us against 16.1
    (1, 4096, 9, 8): 64,  # 17.5 against 18.3
    (1, 1024, 16, 8): 32,  # 14.7 against 16.6
    (3, 512, 64, 8): 160,  # 22.8 against 25.9
    (1, 4096, 4, 8): 64,  # 32 rows: 14.7 against 16.0
    (2, 2048, 4, 8): 64,  # 32 rows: 14.1 against 15.0
    (3, 65536, 16, 8): 4704,  # 261 blocks past one wave: 248.9 against 257.6
    (32, 3000, 64, 8): 3072,  # 502.9 against 546.7
}


@pytest.mark.parametrize(("case", "chunk"), [*H200_FASTEST_CHUNK.items(), *H200_FASTER_OF_TWO_CHUNKS.items()])
def test_plan_picks_the_chunk_measured_fastest(case: tuple[int, int, int, int], chunk: int) -> None:
    bs, prefix, q_len, heads = case
    assert plan_launch(bs, q_len, heads, prefix, num_sms=SMS, fixed_row_groups=True).chunk_keys == chunk


# (bs, prefix, q_len, heads) -> (row groups, chunk) timed fastest on the H200 among blocks of 16, 32 and 48 rows,
# each at up to 7 chunk sizes around its own plan (kernel/bench/results/h200/splits.md, "Row groups").
H200_FASTEST_ROW_GROUPS = {
    (1, 1024, 9, 8): (1, 64),  # 9.5 us; 48-row blocks 11.7
    (1, 2048, 9, 8): (1, 96),  # 10.6; 12.8
    (1, 4096, 9, 8): (1, 160),  # 12.7; 14.5
    (1, 8192, 9, 8): (2, 192),  # 17.3; 17.9
    (1, 16384, 9, 8): (3, 256),  # 24.7; 32 rows 24.9
    (1, 32768, 9, 8): (3, 512),  # 37.9; 40.3
    (2, 4096, 9, 8): (2, 192),  # 17.1; 19.0
    (2, 16384, 9, 8): (3, 512),  # 39.2; 40.1
    (4, 8192, 9, 8): (3, 544),  # 39.1; 40.1
    (1, 8192, 4, 8): (1, 128),  # 32 rows: 13.0 against one 32-row block 14.6
    (1, 32768, 4, 8): (2, 256),  # 22.5; 16-row blocks 25.0
    (1, 8192, 16, 8): (2, 256),  # 128 rows: 20.0; 48-row blocks 21.0
}


@pytest.mark.parametrize(("case", "picked"), H200_FASTEST_ROW_GROUPS.items())
def test_plan_picks_the_row_groups_measured_fastest(case: tuple[int, int, int, int], picked: tuple[int, int]) -> None:
    bs, prefix, q_len, heads = case
    plan = plan_launch(bs, q_len, heads, prefix, num_sms=SMS)
    assert (plan.row_groups, plan.chunk_keys) == picked


@pytest.mark.parametrize(("bs", "prefix", "q_len", "heads"), [(32, 4096, 32, 8), (64, 4096, 16, 8), (16, 2048, 64, 8)])
def test_a_batch_whose_fewest_blocks_fill_the_gpu_keeps_them(bs: int, prefix: int, q_len: int, heads: int) -> None:
    """Smaller blocks are weighed only where the fewest leave SMs idle (timed: 32-row blocks, which the model prefers
    here on wave counts, ran 3% slower at the first two)."""
    assert bs * row_tiling(q_len, heads)[1] >= SMS
    plan = plan_launch(bs, q_len, heads, prefix, num_sms=SMS)
    assert plan == plan_launch(bs, q_len, heads, prefix, num_sms=SMS, fixed_row_groups=True)
    assert plan.row_groups == MAX_ROW_GROUPS


@pytest.mark.parametrize(("bs", "prefix", "q_len", "heads"), [(1, 4096, 9, 8), (2, 3000, 16, 16), (64, 8192, 9, 8)])
def test_fixed_row_groups_takes_the_fewest_blocks(bs: int, prefix: int, q_len: int, heads: int) -> None:
    plan = plan_launch(bs, q_len, heads, prefix, num_sms=SMS, fixed_row_groups=True)
    assert (plan.row_groups, plan.row_blocks) == row_tiling(q_len, heads)
    assert plan_launch(bs, q_len, heads, prefix, num_sms=SMS, max_row_groups=1).row_groups == 1


@pytest.mark.parametrize(
    ("bs", "prefix", "q_len", "heads", "split_layout"),
    [
        # The A/B cases of kernel/bench/results/h200/ab.md (L, M): the split layout lost on chunks of 2-32 tiles,
        # won from 66.
        (1, 1024, 9, 8, False),
        (1, 8192, 9, 8, False),
        (1, 32768, 9, 8, False),
        (8, 8192, 9, 8, True),
        (64, 8192, 9, 8, True),
        (32, 32768, 16, 8, True),
        (32, 4096, 32, 8, True),
        (8, 8192, 64, 16, True),
        (64, 8192, 2, 16, False),  # 32 rows: the 2-row-group block has one layout
    ],
)
def test_split_warp_layout_only_for_long_chunks(
    bs: int, prefix: int, q_len: int, heads: int, split_layout: bool
) -> None:
    plan = plan_launch(bs, q_len, heads, prefix, num_sms=SMS, fixed_row_groups=True)
    assert plan.split_schedulers is split_layout
