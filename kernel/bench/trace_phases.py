"""Phase timeline of a small-batch verify call (H200 diagnostic): where a bs 1 call's microseconds go, from each
block's entry to its last store, for the main kernel and the combine.

Needs a build of kernel/csrc with patches/phases-kernel.diff applied (`run_device.sh phases` makes one): every block
then writes (%globaltimer, %clock64) at fixed points into a buffer the binding owns (`phase_trace()`). Each call runs
in a CUDA graph after a 128 MB copy (a stand-in for the model's previous kernel: the GPU is busy, L2 is cold for
the call's inputs), input sets rotated as in bench_verify.py. Times are in ns from the main kernel's first
block entry, medians over the calls.

    KDTREE_EXT_DIR=/tmp/phase-build python3 kernel/bench/trace_phases.py --out phases.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_verify import CaseRunner
from kdtree_kernel.extension import load_extension

BLOCKS, SLOTS = 1024, 32  # kTraceBlocks, kTraceSlots (phases-kernel.diff)
# Main-kernel events (phases-kernel.diff): index -> what has happened by then.
MAIN_EVENTS = {
    0: "entry",
    1: "kv_indptr read (value thread 0)",
    2: "pool rows of the first tiles landed",
    3: "first gathers issued",
    4: "Q in registers (score warp 0)",
    5: "tile 0 landed (step 0 barrier)",
    6: "step 1 barrier",
    7: "last step barrier",
    8: "epilogue start",
    9: "epilogue stores issued",
}
COMBINE_EVENTS = {0: "entry", 1: "row index read", 2: "partials merged", 3: "groups met", 4: "store"}
CASES = [(1, 1024, 9, 8), (1, 4096, 9, 8), (1, 8192, 9, 8), (1, 32768, 9, 8), (1, 4096, 2, 8)]


def events(raw: list[int], kind: int, block: int) -> dict:
    """The (globaltimer, clock64) pairs one block wrote, by event index (unwritten events are left out), and
    (main kernel) its SM and tile count."""
    base = (kind * BLOCKS + block) * SLOTS
    out: dict = {"smid": raw[base + SLOTS - 2], "tiles": raw[base + SLOTS - 1]}
    for ev in range(SLOTS // 2 - 1):
        g, c = raw[base + 2 * ev], raw[base + 2 * ev + 1]
        if g:
            out[ev] = (g, c)
    return out


def one_call(raw: list[int]) -> dict[str, float]:
    main = [e for e in (events(raw, 0, b) for b in range(BLOCKS)) if 0 in e]
    comb = [e for e in (events(raw, 1, b) for b in range(BLOCKS)) if 0 in e]
    t0 = min(e[0][0] for e in main)
    row: dict[str, float] = {"main blocks": len(main), "combine blocks": len(comb)}
    live = [e for e in main if 9 in e]
    for ev, name in MAIN_EVENTS.items():
        vals = [e[ev][0] - t0 for e in live if ev in e]
        if vals:
            row[f"main {ev} {name}: median"] = statistics.median(vals)
            row[f"main {ev} {name}: last"] = max(vals)
    # Per-block spans in the SM's own clock (cycles).
    for a, b, name in (
        (0, 1, "entry -> kv_indptr"),
        (1, 2, "kv_indptr -> pool rows"),
        (3, 5, "gather -> tile 0"),
        (5, 6, "step 0"),
        (8, 9, "epilogue"),
    ):
        spans = [e[b][1] - e[a][1] for e in live if a in e and b in e]
        if spans:
            row[f"cycles {name}"] = statistics.median(spans)
    steps = [(e[7][1] - e[6][1]) / (e["tiles"] - 1) for e in live if 6 in e and 7 in e and e["tiles"] > 1]
    if steps:
        row["cycles per step (1 .. last)"] = statistics.median(steps)
    row["tiles per block"] = statistics.median(e["tiles"] for e in live)
    row["distinct SMs"] = len({e["smid"] for e in live})
    for ev, name in COMBINE_EVENTS.items():
        vals = [e[ev][0] - t0 for e in comb if ev in e]
        if vals:
            row[f"combine {ev} {name}: first"] = min(vals)
            row[f"combine {ev} {name}: last"] = max(vals)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--calls", type=int, default=24)
    args = parser.parse_args()
    ext = load_extension()
    filler_src = torch.empty(64 * 2**20, dtype=torch.int16, device="cuda")
    filler_dst = torch.empty_like(filler_src)
    results = []
    for bs, prefix, q_len, heads in CASES:
        r = CaseRunner(bs, prefix, q_len, heads, "tree", seed=7)
        graphs = []
        for x in r.cases[: args.calls]:
            fn = r.ours(x)
            fn()  # eager first: the binding allocates its trace buffer outside capture
            torch.cuda.synchronize()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                filler_dst.copy_(filler_src)
                fn()
            graphs.append(g)
        rows = []
        for i in range(args.calls):
            ext.phase_trace()
            graphs[i % len(graphs)].replay()
            torch.cuda.synchronize()
            raw = ext.phase_trace().tolist()
            rows.append(one_call(raw))
        keys = [k for k in rows[0] if all(k in row for row in rows)]
        summary = {k: round(statistics.median(row[k] for row in rows), 1) for k in keys}
        print(f"== bs {bs} prefix {prefix} q_len {q_len} heads {heads}", flush=True)
        for k, v in summary.items():
            print(f"  {k:58s} {v:10.1f}", flush=True)
        results.append({"case": [bs, prefix, q_len, heads], "phases": summary})
        del r, graphs
        torch.cuda.empty_cache()
    args.out.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
