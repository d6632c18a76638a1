"""Split-KV sweep for small batches: times the op with the grid forced to each KV chunk size (beside the
planner's own choice), to fit plan.py's cost model where the GPU is not filled by the batch alone.

    KDTREE_EXT_DIR=kernel/build python3 kernel/bench/probe_splits.py --out splits.jsonl

Timing as bench_verify.py (CUDA-graph replay median over rotated input sets). One JSON line per (case, chunk).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
from dataclasses import replace
from pathlib import Path
from typing import TextIO

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import kdtree_kernel.ops as ops
import kdtree_kernel.plan as plan_module
from bench_verify import CaseRunner, graph_time_us
from kdtree_kernel.plan import LaunchPlan

PLANNED = ops.launch_plan  # the op's own planner (the probes replace ops.launch_plan to force a grid)
CASES = [
    (1, 1024, 9, 8),
    (1, 8192, 9, 8),
    (1, 32768, 9, 8),
    (1, 8192, 64, 8),
    (2, 8192, 9, 8),
    (4, 8192, 9, 8),
    (8, 8192, 9, 8),
    (8, 32768, 9, 8),
]
CHUNKS = [32, 64, 96, 128, 192, 256, 384, 512, 1024, 2048, 4096]


def forced(plan: LaunchPlan, chunk: int, max_keys: int) -> LaunchPlan:
    return replace(plan, splits=math.ceil(max_keys / chunk), chunk_keys=chunk)


def time_forced(r: CaseRunner, plan: LaunchPlan) -> float:
    """The op's time (us) on the case's input sets with its grid forced to ``plan``."""
    ops.launch_plan = lambda *a, _p=plan, **k: _p  # the op asks for its grid here
    try:
        r.ws = torch.empty(max(1, plan.workspace_bytes), dtype=torch.uint8, device="cuda")
        return graph_time_us([r.ours(x) for x in r.cases])
    finally:
        ops.launch_plan = PLANNED


def _sizes(bs: int, prefix: int, q_len: int, heads: int, plan: LaunchPlan) -> dict[str, int]:
    return {
        "bs": bs,
        "prefix": prefix,
        "q_len": q_len,
        "heads": heads,
        "chunk": plan.chunk_keys,
        "splits": plan.splits,
        "blocks": plan.blocks,
    }


def emit(out: TextIO, rec: dict[str, object]) -> None:
    print(json.dumps(rec), flush=True)
    out.write(json.dumps(rec) + "\n")


def kernel_times(out: TextIO) -> None:
    """GPU time of each kernel of the op (main, combine) at the planned grid, from the torch profiler over eager
    calls: the graph time minus their sum is what launches and gaps cost."""
    from torch.profiler import ProfilerActivity, profile

    for bs, prefix, q_len, heads in CASES[:4]:
        r = CaseRunner(bs, prefix, q_len, heads, "tree", seed=5)
        calls = [r.ours(x) for x in r.cases]
        for fn in calls:
            fn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for fn in calls:
                fn()
            torch.cuda.synchronize()
        per_kernel = {}
        for e in prof.key_averages():
            if e.device_type.name == "CUDA" and "verify" in e.key:
                per_kernel[e.key.split("(")[0][-40:]] = round(e.device_time_total / e.count, 2)
        rec = {
            "bs": bs,
            "prefix": prefix,
            "q_len": q_len,
            "heads": heads,
            "graph_us": round(graph_time_us(calls), 2),
            "kernel_us": per_kernel,
        }
        print(json.dumps(rec), flush=True)
        out.write(json.dumps(rec) + "\n")
        del r
        torch.cuda.empty_cache()


# Where --partial-bytes looks for plans that the cost model's count of partial bytes changes.
MODEL_GRID_BS = (1, 2, 3, 4, 8, 16, 32)
MODEL_GRID_PREFIX = (512, 1024, 2048, 3000, 4096, 6000, 8192, 16384, 32768, 65536, 131072)
MODEL_GRID_ROWS = ((9, 8), (2, 8), (4, 8), (1, 8), (16, 8), (16, 16), (32, 8), (64, 8), (9, 16), (128, 8))


def plan_counting(row_bytes: int, bs: int, q_len: int, heads: int, prefix: int) -> LaunchPlan:
    """The op's plan on this device with the cost model counting ``row_bytes`` per partial row everywhere
    (plan.py counts bf16 partials for some plans and fp32 ones for the rest)."""
    kept = plan_module.PARTIAL_ROW_BYTES, plan_module.FP32_PARTIAL_ROW_BYTES
    plan_module.PARTIAL_ROW_BYTES = plan_module.FP32_PARTIAL_ROW_BYTES = row_bytes
    ops._plan.cache_clear()  # the op memoises its plans: none planned under other constants may be reused
    try:
        return PLANNED(bs, q_len, heads, prefix)
    finally:
        plan_module.PARTIAL_ROW_BYTES, plan_module.FP32_PARTIAL_ROW_BYTES = kept
        ops._plan.cache_clear()


def compare_partial_bytes(out: TextIO) -> None:
    """Every grid case whose plan differs between the cost model counting fp32 partials and bf16 ones, timed
    under both plans (alternating, two rounds, the faster kept), with the one the planner picks."""
    fp32, bf16 = plan_module.FP32_PARTIAL_ROW_BYTES, plan_module.PARTIAL_ROW_BYTES
    for bs, prefix, (q_len, heads) in itertools.product(MODEL_GRID_BS, MODEL_GRID_PREFIX, MODEL_GRID_ROWS):
        plans = {
            "fp32": plan_counting(fp32, bs, q_len, heads, prefix),
            "bf16": plan_counting(bf16, bs, q_len, heads, prefix),
        }
        if plans["fp32"] == plans["bf16"]:
            continue
        picked = PLANNED(bs, q_len, heads, prefix)
        r = CaseRunner(bs, prefix, q_len, heads, "tree", seed=bs + prefix + q_len)
        best: dict[str, float] = {}
        for _ in range(2):
            for label, plan in plans.items():
                us = time_forced(r, plan)
                best[label] = min(best.get(label, us), us)
        rec = {
            "bs": bs,
            "prefix": prefix,
            "q_len": q_len,
            "heads": heads,
            **{f"{label}_chunk": plan.chunk_keys for label, plan in plans.items()},
            **{f"{label}_splits": plan.splits for label, plan in plans.items()},
            **{f"{label}_us": round(us, 2) for label, us in best.items()},
            "planned": next(label for label, plan in plans.items() if plan == picked),
        }
        emit(out, rec)
        del r
        torch.cuda.empty_cache()


# Where --row-groups looks: small batches of the K2.6 verify case (72 rows) and of 32 and 128 rows.
ROW_GROUP_CASES = [
    (1, 1024, 9, 8),
    (1, 2048, 9, 8),
    (1, 4096, 9, 8),
    (1, 8192, 9, 8),
    (1, 16384, 9, 8),
    (1, 32768, 9, 8),
    (2, 4096, 9, 8),
    (2, 16384, 9, 8),
    (4, 8192, 9, 8),
    (1, 8192, 4, 8),
    (1, 32768, 4, 8),
    (1, 8192, 16, 8),
]
ROW_GROUP_CHUNKS = [32, 64, 128, 256, 512, 1024]


def sweep_row_groups(cases: list[tuple[int, ...]], out: TextIO) -> None:
    """Each case with blocks of every row-group count (16, 32 or 48 rows) at the chunk the cost model picks for
    that count and at the chunk sizes around it, beside the planner's own pick."""
    device = torch.cuda.current_device()
    sms = ops._num_sms(device)
    for i, (bs, prefix, q_len, heads) in enumerate(cases):
        r = CaseRunner(bs, prefix, q_len, heads, "tree", seed=91 + i)
        picked = PLANNED(bs, q_len, heads, prefix)
        max_keys = prefix + q_len
        for groups in range(1, plan_module.MAX_ROW_GROUPS + 1):
            model = ops._plan(bs, q_len, heads, prefix, sms, ops._blocks_per_sm(groups), groups, True)
            if model.row_groups != groups:
                continue  # fewer rows than such a block holds
            options = [("model", model)] + [
                (str(c), forced(model, c, max_keys))
                for c in ROW_GROUP_CHUNKS
                if c < max_keys and c != model.chunk_keys and model.row_blocks * bs * math.ceil(max_keys / c) <= 3 * sms
            ]
            for label, plan in options:
                us = time_forced(r, plan)
                emit(
                    out,
                    {
                        **_sizes(bs, prefix, q_len, heads, plan),
                        "row_groups": groups,
                        "row_blocks": plan.row_blocks,
                        "label": label,
                        "picked": plan == picked,
                        "us": round(us, 2),
                    },
                )
        del r
        torch.cuda.empty_cache()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--kernel-times", action="store_true", help="per-kernel GPU times at the planned grid")
    parser.add_argument(
        "--partial-bytes", action="store_true", help="plans the model's fp32 and bf16 partial counts differ on"
    )
    parser.add_argument(
        "--cases", default="", help="sweep these cases instead of CASES: BSxPREFIXxQLENxHEADS, comma-separated"
    )
    parser.add_argument(
        "--row-groups", action="store_true", help="every row-group count and chunks around its plan (ROW_GROUP_CASES)"
    )
    args = parser.parse_args()
    cases = [tuple(int(x) for x in item.split("x")) for item in args.cases.split(",") if item] or CASES
    if args.row_groups:
        with args.out.open("a") as out:
            sweep_row_groups(cases if args.cases else ROW_GROUP_CASES, out)
        return
    if args.partial_bytes:
        with args.out.open("a") as out:
            compare_partial_bytes(out)
        return
    if args.kernel_times:
        with args.out.open("a") as out:
            kernel_times(out)
        return
    with args.out.open("a") as out:
        for i, (bs, prefix, q_len, heads) in enumerate(cases):
            r = CaseRunner(bs, prefix, q_len, heads, "tree", seed=77 + i)
            default = PLANNED(bs, q_len, heads, prefix)
            max_keys = prefix + q_len
            options = [("plan", default)] + [
                (str(c), forced(default, c, max_keys)) for c in CHUNKS if c < max_keys * 2 and c != default.chunk_keys
            ]
            for label, plan in options:
                us = time_forced(r, plan)
                emit(out, {**_sizes(bs, prefix, q_len, heads, plan), "label": label, "us": round(us, 2)})
            del r
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
