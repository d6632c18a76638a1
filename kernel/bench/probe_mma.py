"""mma.sync issue rate by warps per SM (H200 diagnostic): how many warps per scheduler it takes to keep the tensor
pipe busy with 8 independent m16n8k16 accumulators per warp (kernel/bench/mma_rate.cu, built by mma_probe.py).

    python3 kernel/bench/probe_mma.py --out probe-mma.json

Each point: one block per SM of `warps` warps (so warps / 4 per scheduler), CUDA-event median of 20 launches.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch
from mma_probe import load_mma_probe

ITERS = 4096
FLOP_PER_MMA = 2 * 16 * 8 * 16  # m16n8k16


def time_ms(fn, reps: int = 20) -> float:
    fn()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    probe = load_mma_probe()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    sink = torch.zeros(sms * 8, dtype=torch.float32, device="cuda")
    rows = []
    for warps in (1, 2, 4, 8, 12, 16, 24, 32):
        flops = probe.run(sink, sms, warps, ITERS)
        ms = time_ms(lambda w=warps: probe.run(sink, sms, w, ITERS))
        mma_per_warp = flops / FLOP_PER_MMA / (sms * warps)
        row = {
            "warps_per_sm": warps,
            "tflops": round(flops / ms / 1e9, 1),
            "us": round(ms * 1e3, 1),
            "ns_per_mma_per_warp": round(ms * 1e6 / mma_per_warp, 3),
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
    args.out.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
