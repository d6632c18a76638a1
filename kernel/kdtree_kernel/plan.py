"""Launch planning for the verify kernel: a pure function of python ints, so the grid is known without reading
device tensors (CUDA-graph safe: capture with the worst-case ``max_prefix_len``; blocks past a request's keys
exit at once).

A block serves one request, up to 48 (token, head) rows of it (``row_groups`` x 16) and one chunk of its keys:
two score warps per row group plus 8 value warps (csrc/verify_attention_kernel.cuh).
Small batches split the keys into ``splits`` chunks so the grid fills the GPU; a combine kernel merges them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

HEAD_DIM = 576
VALUE_DIM = 512
BLOCK_N = 32  # chunks are multiples of this many keys (kChunkAlign in csrc/verify_attention.h)
MAX_Q_LEN = 128
MAX_ROW_GROUPS = 3
ROWS_PER_GROUP = 16
MIN_CHUNK_KEYS = BLOCK_N  # the fastest chunk at bs 1 x 1k (docs/kernel-notes.md, "The launch planner")
MAX_SPLITS = 256
# Cost model in units of "one KV tile of a 48-row block": per row-group count (1, 2, 3), the cost of a tile and
# the fixed per-block work (Q load, pipeline fill, epilogue); and the combine pass (a launch plus the partials'
# round trip, bytes per tile-step of the whole GPU). Smaller blocks run a shorter step and load less of Q, so they
# can win where a small batch leaves SMs for KV chunks to fill. The constants are fitted to H200 timings
# (docs/kernel-notes.md, "The launch planner").
TILE_COST = (0.64, 0.78, 1.0)
BLOCK_OVERHEAD_TILES = (0.46, 1.18, 1.5)
COMBINE_LAUNCH_TILES = 2.0
BYTES_PER_TILE_STEP = 4.9e6
PARTIAL_ROW_BYTES = VALUE_DIM * 2 + 4  # the workspace's layout: bf16 partial row + fp32 LSE
# The model was fitted with fp32 partials: 48-row plans that fit one wave count the bf16 bytes the partials have
# now (faster there), the others keep the fitted count (slower otherwise; docs/kernel-notes.md, "The launch planner").
FP32_PARTIAL_ROW_BYTES = (VALUE_DIM + 1) * 4
# The 48-row block has two warp layouts (csrc/verify_attention_kernel.cuh, score_slot): the split one pays off on
# long chunks only (docs/kernel-notes.md, "The launch planner").
SPLIT_SCHEDULERS_MIN_KEYS = 1024


@dataclass(frozen=True)
class LaunchPlan:
    row_groups: int  # 16-row groups per block (1..3): threads = 32 * (2 * row_groups + 8)
    row_blocks: int  # blocks along one request's q_len * heads rows
    splits: int  # KV chunks per request (grid.y)
    chunk_keys: int  # keys per chunk, a multiple of BLOCK_N
    rows: int  # q_len * heads
    bs: int

    @property
    def blocks(self) -> int:
        """Blocks of the main kernel's grid: row blocks x KV chunks x requests."""
        return self.row_blocks * self.splits * self.bs

    @property
    def split_schedulers(self) -> bool:
        """Whether the 48-row block runs its split warp layout (score and value warps on separate schedulers)."""
        return self.row_groups == MAX_ROW_GROUPS and self.chunk_keys >= SPLIT_SCHEDULERS_MIN_KEYS

    @property
    def workspace_bytes(self) -> int:
        """Bytes of scratch the launch needs: bf16 partial outputs + fp32 partial LSEs when splits > 1, else 0
        (kPartialRowBytes in csrc/verify_attention.h)."""
        if self.splits == 1:
            return 0
        return self.bs * self.splits * self.rows * PARTIAL_ROW_BYTES


def row_tiling(q_len: int, heads: int, max_row_groups: int = MAX_ROW_GROUPS) -> tuple[int, int]:
    """(row_groups, row_blocks) covering q_len * heads rows with as little padding as blocks of at most
    ``max_row_groups`` x 16 rows allow (the fp8 pool's e4m3 tensor-core kernel takes 16-row blocks: 1)."""
    rows = q_len * heads
    row_blocks = math.ceil(rows / (max_row_groups * ROWS_PER_GROUP))
    row_groups = math.ceil(math.ceil(rows / row_blocks) / ROWS_PER_GROUP)
    return row_groups, row_blocks


def _split_cost(
    row_groups: int, splits: int, blocks: int, slots: int, max_keys: int, partial_bytes_per_split: int
) -> float:
    waves = math.ceil(blocks * splits / slots)
    tiles = math.ceil(math.ceil(max_keys / splits) / BLOCK_N)
    cost = waves * (tiles * TILE_COST[row_groups - 1] + BLOCK_OVERHEAD_TILES[row_groups - 1])
    if splits > 1:
        cost += COMBINE_LAUNCH_TILES + splits * partial_bytes_per_split / BYTES_PER_TILE_STEP
    return cost


def plan_launch(
    bs: int,
    q_len: int,
    heads: int,
    max_prefix_len: int,
    *,
    num_sms: int,
    blocks_per_sm: int = 1,
    max_row_groups: int = MAX_ROW_GROUPS,
    fixed_row_groups: bool = False,
) -> LaunchPlan:
    """Choose the grid for a batch of ``bs`` requests whose prefixes are at most ``max_prefix_len`` keys: the
    row-group count (1..``max_row_groups``) and KV chunk of least modelled cost where the fewest blocks that cover
    the rows (row_tiling) leave SMs idle, else those blocks and their chunk. ``fixed_row_groups``: always the fewest
    blocks of at most ``max_row_groups`` x 16 rows."""
    if bs < 1:
        raise ValueError(f"bs must be >= 1, got {bs}")
    if not 1 <= q_len <= MAX_Q_LEN:
        raise ValueError(f"q_len must be in [1, {MAX_Q_LEN}], got {q_len}")
    if heads < 1:
        raise ValueError(f"heads must be >= 1, got {heads}")
    if max_prefix_len < 0:
        raise ValueError(f"max_prefix_len must be >= 0, got {max_prefix_len}")
    if not 1 <= max_row_groups <= MAX_ROW_GROUPS:
        raise ValueError(f"max_row_groups must be in [1, {MAX_ROW_GROUPS}], got {max_row_groups}")
    max_keys = max_prefix_len + q_len
    slots = max(1, num_sms * max(1, blocks_per_sm))
    rows = q_len * heads
    fewest = row_tiling(q_len, heads, max_row_groups)
    # Smaller blocks only where the batch leaves SMs for KV chunks to fill: where the fewest blocks fill the GPU
    # by themselves they also read each key the fewest times (docs/kernel-notes.md, "The launch planner").
    if fixed_row_groups or bs * fewest[1] >= slots:
        tilings = {fewest}
    else:
        tilings = {row_tiling(q_len, heads, g) for g in range(1, max_row_groups + 1)}
    plans = [_chunked(bs, rows, row_groups, row_blocks, max_keys, slots) for row_groups, row_blocks in tilings]
    # Compared on the bytes the partials really have (bf16); ties go to fewer, larger blocks.
    per_split = _partial_bytes_per_split(bs, rows, PARTIAL_ROW_BYTES)
    return min(
        plans,
        key=lambda p: (
            _split_cost(p.row_groups, p.splits, bs * p.row_blocks, slots, max_keys, per_split),
            -p.row_groups,
        ),
    )


def _partial_bytes_per_split(bs: int, rows: int, partial_row_bytes: int) -> int:
    """Bytes of one chunk's partials for the whole batch, written by the main kernel and read back by the combine."""
    return 2 * bs * rows * partial_row_bytes


def _chunked(bs: int, rows: int, row_groups: int, row_blocks: int, max_keys: int, slots: int) -> LaunchPlan:
    """The plan of least modelled cost for this row tiling: its KV chunk."""
    blocks = bs * row_blocks
    upper = max(1, min(MAX_SPLITS, math.ceil(max_keys / MIN_CHUNK_KEYS)))

    def chunking(partial_row_bytes: int) -> tuple[int, int]:
        per_split = _partial_bytes_per_split(bs, rows, partial_row_bytes)
        splits = min(
            range(1, upper + 1),
            key=lambda s: (_split_cost(row_groups, s, blocks, slots, max_keys, per_split), s),
        )
        chunk_keys = math.ceil(math.ceil(max_keys / splits) / BLOCK_N) * BLOCK_N
        return math.ceil(max_keys / chunk_keys), chunk_keys  # rounding the chunk up can leave the last split empty

    # The bf16 count only where it was measured faster (see FP32_PARTIAL_ROW_BYTES); planning is on every eager
    # call's path, so the other plans do not pay for a chunking they would discard.
    if row_groups == MAX_ROW_GROUPS:
        splits, chunk_keys = chunking(PARTIAL_ROW_BYTES)
        if blocks * splits <= slots:
            return LaunchPlan(row_groups, row_blocks, splits, chunk_keys, rows, bs)
    splits, chunk_keys = chunking(FP32_PARTIAL_ROW_BYTES)
    return LaunchPlan(row_groups, row_blocks, splits, chunk_keys, rows, bs)


def max_workspace_bytes(
    bs: int,
    q_len: int,
    heads: int,
    max_prefix_len: int,
    *,
    num_sms: int,
    blocks_per_sm: int = 1,
    max_row_groups: int = MAX_ROW_GROUPS,
    fixed_row_groups: bool = False,
) -> int:
    """Workspace that serves every batch size 1..bs (smaller batches split their keys further, so their
    partials can outgrow those of the largest batch); what a CUDA-graph runner allocates once."""
    return max(
        plan_launch(
            b,
            q_len,
            heads,
            max_prefix_len,
            num_sms=num_sms,
            blocks_per_sm=blocks_per_sm,
            max_row_groups=max_row_groups,
            fixed_row_groups=fixed_row_groups,
        ).workspace_bytes
        for b in range(1, bs + 1)
    )
