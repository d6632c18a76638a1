"""Time per 16-key step by batch shape, with the SM clock and board power sampled while the case runs (H200
diagnostic). Answers: is a step slower when more requests' KV streams from DRAM at once, or when the clock
drops under load?

    KDTREE_EXT_DIR=kernel/build python3 kernel/bench/probe_steps.py --out steps.jsonl

Each case: CUDA-graph replay median (bench_verify.graph_time_us), the planner's grid (blocks, waves, 16-key
steps per block), then ~1.5 s of back-to-back replays while nvidia-smi samples clocks.sm and power.draw every
50 ms. us_per_step = time / (waves * steps): it includes each block's fixed cost (~3 us), small next to
hundreds of steps.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_verify import CaseRunner, capture_graph, graph_time_us
from kdtree_kernel.ops import launch_plan
from kdtree_kernel.plan import HEAD_DIM

# (bs, prefix, q_len, heads): 1, 2, 3 or 6 blocks per request; q 9 x H 8 (48 + 24 rows) beside all-full blocks.
CASES = [
    (64, 8192, 9, 8),
    (48, 8192, 9, 8),
    (66, 8192, 9, 8),
    (44, 8192, 9, 16),
    (128, 4096, 6, 8),
    (66, 8192, 6, 8),
    (32, 8192, 16, 8),
    (44, 8192, 16, 8),
    (22, 8192, 32, 8),
]
SAMPLE_S = 1.5
TILE_KEYS = 16  # keys per kernel step (kBlockN in csrc/verify_attention_kernel.cuh)


def sustained_clock(calls: list[Callable[[], object]]) -> dict:
    """Replays a graph of ``calls`` for SAMPLE_S seconds while nvidia-smi samples the SM clock and power."""
    graph, _ = capture_graph(calls)
    graph.replay()
    torch.cuda.synchronize()
    smi = subprocess.Popen(
        ["nvidia-smi", "--query-gpu=clocks.sm,power.draw", "--format=csv,noheader,nounits", "-lms", "50"],
        stdout=subprocess.PIPE,
        text=True,
    )
    t0 = time.monotonic()
    while time.monotonic() - t0 < SAMPLE_S:
        for _ in range(10):
            graph.replay()
        torch.cuda.synchronize()
    smi.terminate()
    out, _ = smi.communicate()
    samples = [tuple(float(v) for v in line.split(",")) for line in out.splitlines() if line.strip()]
    busy = samples[2:-1] or samples  # the first samples can predate the load
    return {
        "sm_mhz": round(statistics.median(s[0] for s in busy)),
        "watts": round(statistics.median(s[1] for s in busy)),
        "samples": len(busy),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    with args.out.open("a") as out:
        for i, (bs, prefix, q_len, heads) in enumerate(CASES):
            plan = launch_plan(bs, q_len, heads, prefix)  # the grid the op launches
            waves = math.ceil(plan.blocks / sms)  # one block per SM (the kernel's launch bounds)
            steps = math.ceil(plan.chunk_keys / TILE_KEYS)
            r = CaseRunner(bs, prefix, q_len, heads, "tree", seed=7000 + i)
            calls = [r.ours(x) for x in r.cases]
            us = graph_time_us(calls)
            rec = {
                "bs": bs,
                "prefix": prefix,
                "q_len": q_len,
                "heads": heads,
                "row_blocks": plan.row_blocks,
                "splits": plan.splits,
                "split_layout": plan.split_schedulers,
                "blocks": plan.blocks,
                "waves": waves,
                "steps": steps,
                "us": round(us, 1),
                "us_per_step": round(us / (waves * steps), 4),
                "dram_gbps_unique": round(bs * (prefix + q_len) * HEAD_DIM * 2 / us / 1e3),
                **sustained_clock(calls),
            }
            print(json.dumps(rec), flush=True)
            out.write(json.dumps(rec) + "\n")
            del r, calls
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
