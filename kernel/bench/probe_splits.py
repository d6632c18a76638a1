"""Split-KV sweep for small batches: times the op with the grid forced to each KV chunk size (beside the
planner's own choice), to fit plan.py's cost model where the GPU is not filled by the batch alone.

    KDTREE_EXT_DIR=kernel/build python3 kernel/bench/probe_splits.py --out splits.jsonl

Timing as bench_verify.py (CUDA-graph replay median over rotated input sets). One JSON line per (case, chunk).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import replace
from pathlib import Path
from typing import TextIO

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import kdtree_kernel.ops as ops
from bench_verify import CaseRunner, graph_time_us
from kdtree_kernel.plan import LaunchPlan

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--kernel-times", action="store_true", help="per-kernel GPU times at the planned grid")
    args = parser.parse_args()
    if args.kernel_times:
        with args.out.open("a") as out:
            kernel_times(out)
        return
    planned = ops.launch_plan
    with args.out.open("a") as out:
        for i, (bs, prefix, q_len, heads) in enumerate(CASES):
            r = CaseRunner(bs, prefix, q_len, heads, "tree", seed=77 + i)
            default = planned(bs, q_len, heads, prefix)
            max_keys = prefix + q_len
            options = [("plan", default)] + [
                (str(c), forced(default, c, max_keys)) for c in CHUNKS if c < max_keys * 2 and c != default.chunk_keys
            ]
            for label, plan in options:
                ops.launch_plan = lambda *a, _p=plan, **k: _p  # the op asks for its grid here
                r.ws = torch.empty(max(1, plan.workspace_bytes), dtype=torch.uint8, device="cuda")
                us = graph_time_us([r.ours(x) for x in r.cases])
                rec = {
                    "bs": bs,
                    "prefix": prefix,
                    "q_len": q_len,
                    "heads": heads,
                    "chunk": plan.chunk_keys,
                    "splits": plan.splits,
                    "blocks": plan.blocks,
                    "label": label,
                    "us": round(us, 2),
                }
                print(json.dumps(rec), flush=True)
                out.write(json.dumps(rec) + "\n")
            ops.launch_plan = planned
            del r
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
