"""A/B timing of kernel builds: our kernel alone (no Triton) on the benchmark's tree cases, for the extension
that KDTREE_EXT_DIR points at. Run it once per build, alternating builds, in one GPU session; the
`ab` stage of run_device.sh does that for the working tree against kernel sources saved under .ab/.

    KDTREE_EXT_DIR=kernel/build python3 kernel/bench/ab_kernel.py --label new --out ab.jsonl

Each case: CUDA-graph replay median over rotated input sets (as bench_verify.py times it) and the relative
error against the fp32 reference. Appends one JSON line per case to --out.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_verify import SM_SCALE, TREE_CASES, CaseRunner, graph_time_us
from kdtree_kernel.testing import rel_error


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--label", required=True)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--no-check", action="store_true", help="time only (skip the fp32 reference)")
    parser.add_argument("--cases", default="", help="comma-separated indices into TREE_CASES (default: all)")
    args = parser.parse_args()
    with args.out.open("a") as out:
        picked = {int(x) for x in args.cases.split(",") if x} or set(range(len(TREE_CASES)))
        for i, (bs, prefix, q_len, heads) in enumerate(TREE_CASES):
            if i not in picked:
                continue
            r = CaseRunner(bs, prefix, q_len, heads, "tree", seed=1000 * i)
            c = r.c
            err = None
            if not args.no_check:
                r.ours(c)()
                ref = c.reference(SM_SCALE)
                err = rel_error(r.out, ref)
                del ref
            us = graph_time_us([r.ours(x) for x in r.cases])
            rec = {
                "label": args.label,
                "bs": bs,
                "prefix": prefix,
                "q_len": q_len,
                "heads": heads,
                "us": round(us, 2),
                "rel_err": err,
            }
            print(json.dumps(rec), flush=True)
            out.write(json.dumps(rec) + "\n")
            del r
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
