"""Per-warp clock trace of the verify kernel's 16-key steps (H200 diagnostic): where a step's ~1600 cycles go.

Needs a build of kernel/csrc with patches/trace-kernel.diff applied (`run_device.sh trace` makes one): block (row
block 0, split 0) of request 5 then writes %clock at fixed points of steps 100..107 into its own output rows (so its
output is garbage), for each of its block's warps. This script runs one case (bs 64 x 8192 q 9 H 8, the split
layout of 48-row blocks, unless --case names another whose plan has one KV chunk per request: the combine would
overwrite the traced rows), reads the clocks back and prints, per role, the median cycle (relative to the block
barrier's release, the earliest post-barrier clock of a score warp) at which each phase ends.

    KDTREE_EXT_DIR=/tmp/trace-build python3 kernel/bench/trace_steps.py --out trace.json [--case 128x4096x4x8]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ab_kernel import parse_shapes
from bench_verify import CaseRunner
from kdtree_kernel import launch_plan
from kdtree_kernel.plan import VALUE_DIM

TRACE_REQ, TRACE_STEPS, TRACE_EVENTS = 5, 8, 8  # as in trace-kernel.diff


@dataclass(frozen=True)
class WarpMap:
    """A block layout's warps by role (csrc score_slot / value_slot): launched warps, score warps, the value warps
    that issue the gathers (value slots 0..3) and the other value warps."""

    warps: int
    score: tuple[int, ...]
    gather: tuple[int, ...]
    other_value: tuple[int, ...]


# (row groups, split layout) -> warps
WARP_MAPS = {
    (1, False): WarpMap(10, (2, 3), (0, 1, 4, 5), (6, 7, 8, 9)),
    (2, False): WarpMap(12, (0, 1, 2, 3), (4, 5, 6, 7), (8, 9, 10, 11)),
    (3, False): WarpMap(14, (0, 1, 2, 3, 6, 7), (4, 5, 8, 9), (10, 11, 12, 13)),
    (3, True): WarpMap(16, (2, 3, 6, 7, 10, 11), (0, 1, 4, 5), (8, 9, 12, 13)),  # 2 idle warps
}
# event index -> phase name, per role (trace-kernel.diff TR(n))
SCORE_EVENTS = {2: "S mma done", 3: "pair exchange", 4: "softmax, P stored"}
VALUE_EVENTS = {3: "gathers issued", 4: "P/V fragments, rescale vote", 5: "P V mma issued"}


def wrap(x: int) -> int:
    x &= 0xFFFFFFFF
    return x - (1 << 32) if x >= 1 << 31 else x


def summarise(trace: list[int], layout: WarpMap) -> dict:
    def ev(w: int, s: int, e: int) -> int:
        return trace[(w * TRACE_STEPS + s) * TRACE_EVENTS + e]

    def release(s: int) -> int:
        # The score warps' first clock after the barrier. (The value warps' post-barrier clock is not used: ptxas
        # may hoist that clock read above their barrier, which read up to 350 cycles early.)
        base = ev(layout.score[0], s, 1)
        return base + min(wrap(ev(w, s, 1) - base) for w in layout.score)

    phases: dict[str, list[int]] = {}

    def add(name: str, v: int) -> None:
        phases.setdefault(name, []).append(v)

    for s in range(TRACE_STEPS - 1):
        r0, r1 = release(s), release(s + 1)
        add("step period", wrap(r1 - r0))
        for w in layout.score:
            for e, name in SCORE_EVENTS.items():
                add(f"score: {name}", wrap(ev(w, s, e) - r0))
            add("score: at next barrier", wrap(ev(w, s + 1, 0) - r0))
        for group, warps in (("gather value warps", layout.gather), ("other value warps", layout.other_value)):
            for w in warps:
                for e, name in VALUE_EVENTS.items():
                    add(f"{group}: {name}", wrap(ev(w, s, e) - r0))
                add(f"{group}: at next barrier", wrap(ev(w, s + 1, 1) - r0))
    return {k: round(statistics.median(v)) for k, v in phases.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--case", default="64x8192x9x8", help="BSxPREFIXxQLENxHEADS, one KV chunk per request")
    args = parser.parse_args()
    shapes = parse_shapes(args.case)
    if len(shapes) != 1 or shapes[0][4]:
        raise SystemExit(f"--case {args.case!r}: one bf16 case, BSxPREFIXxQLENxHEADS")
    bs, prefix, q_len, heads, _ = shapes[0]
    plan = launch_plan(bs, q_len, heads, prefix)
    if plan.splits != 1:
        raise SystemExit(
            f"{args.case}: the plan splits the keys ({plan.splits} chunks); the combine would overwrite the trace"
        )
    layout = WARP_MAPS[(plan.row_groups, plan.split_schedulers)]
    r = CaseRunner(bs, prefix, q_len, heads, "tree", seed=11)
    x = r.cases[0]
    start = int(x.qo_indptr[TRACE_REQ]) * heads * VALUE_DIM // 2  # int32 words of bf16 output
    runs = []
    for _ in range(args.reps):
        r.out.zero_()
        r.ours(x)()
        torch.cuda.synchronize()
        words = r.out.view(-1).view(torch.int32)[start : start + layout.warps * TRACE_STEPS * TRACE_EVENTS]
        runs.append(summarise([w & 0xFFFFFFFF for w in words.cpu().tolist()], layout))
    result = {k: round(statistics.median(run[k] for run in runs)) for k in runs[0]}
    for k, v in result.items():
        print(f"{k:48s} {v:6d}")
    args.out.write_text(
        json.dumps(
            {"case": [bs, prefix, q_len, heads], "row_groups": plan.row_groups, "cycles_after_release": result},
            indent=1,
        )
        + "\n"
    )


if __name__ == "__main__":
    main()
