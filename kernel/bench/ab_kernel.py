"""A/B timing of kernel builds: our kernel alone (no Triton) on the benchmark's tree cases, for the extension
that KDTREE_EXT_DIR points at. Run it once per build, alternating builds, in one GPU session; the
`ab` stage of run_device.sh does that for the working tree against kernel sources saved under .ab/.

    KDTREE_EXT_DIR=kernel/build python3 kernel/bench/ab_kernel.py --label new --out ab.jsonl
    python3 kernel/bench/ab_kernel.py --summarize ab.jsonl      # one table: best us per case and label

Each case: CUDA-graph replay median over rotated input sets (as bench_verify.py times it) and the relative
error against the fp32 reference. Appends one JSON line per case to --out. ``--shapes`` adds cases outside
TREE_CASES (``BSxPREFIXxQLENxHEADS``, ``:fp8`` for an fp8 pool); ``--interleave`` puts a foreign elementwise
kernel before every call in the graph, as in a model's forward pass where the verify follows other kernels (its own
time, measured alone, is subtracted), so that launch overlap with our own previous call is not counted.
``AB_HOT_Q=1`` in the environment gives every input set the first set's Q: Q then stays in L2 from call to call (as
when the projection that writes Q runs just before), while the keys still rotate past L2.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_verify import SM_SCALE, TREE_CASES, CaseRunner, graph_time_us
from kdtree_kernel.testing import rel_error

Shape = tuple[int, int, int, int, bool]  # bs, prefix, q_len, heads, fp8 pool
FOREIGN_ELEMENTS = 1 << 20  # the interleaved kernel: 4 MB of fp32 scaled in place, ~2-3 us on an H200


def split_list(text: str) -> list[str]:
    """The items of a list given as one argument or environment value, separated by commas or whitespace (the
    device stages' variables mix both: TRACE_CASES and AB_ENVS take spaces, AB_CASES and AB_SHAPES took commas)."""
    return [item for item in re.split(r"[,\s]+", text) if item]


def parse_cases(text: str) -> set[int]:
    """'0,2 5' -> {0, 2, 5}: indices into TREE_CASES."""
    picked: set[int] = set()
    for item in split_list(text):
        if not item.isdigit() or int(item) >= len(TREE_CASES):
            raise ValueError(f"case {item!r} is not an index into TREE_CASES (0..{len(TREE_CASES) - 1})")
        picked.add(int(item))
    return picked


def parse_shapes(text: str) -> list[Shape]:
    """'1x4096x9x8,1x131072x2x8:fp8' -> [(1, 4096, 9, 8, False), (1, 131072, 2, 8, True)]."""
    shapes: list[Shape] = []
    for item in split_list(text):
        dims, _, kind = item.partition(":")
        parts = dims.split("x")
        if len(parts) != 4 or not all(part.isdigit() and int(part) > 0 for part in parts):
            raise ValueError(f"shape {item!r} is not BSxPREFIXxQLENxHEADS (four positive integers)")
        if kind not in ("", "fp8"):
            raise ValueError(f"unknown pool kind {kind!r} in {item!r} (only ':fp8')")
        bs, prefix, q_len, heads = (int(part) for part in parts)
        shapes.append((bs, prefix, q_len, heads, kind == "fp8"))
    return shapes


def with_foreign(calls: list[Callable[[], object]], scratch: torch.Tensor) -> list[Callable[[], object]]:
    def wrap(fn: Callable[[], object]) -> Callable[[], object]:
        def run() -> object:
            scratch.mul_(1.0)
            return fn()

        return run

    return [wrap(fn) for fn in calls]


def summarize(path: Path) -> str:
    """Best time per case and label (labels as columns, ratios against `base` or else the first label), and the
    max rel err per label."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    best: dict[tuple, dict[str, float]] = collections.defaultdict(dict)
    for r in rows:
        key = (r["bs"], r["prefix"], r["q_len"], r["heads"], r.get("kv", "bf16"), r.get("interleave", False))
        best[key][r["label"]] = min(best[key].get(r["label"], 1e9), r["us"])
    labels = list(dict.fromkeys(r["label"] for r in rows))
    if "base" in labels:  # ratios against the saved base build where there is one
        labels.remove("base")
        labels.insert(0, "base")
    lines = ["| bs | prefix | q_len | H | kv | interleaved | " + " | ".join(labels) + " |"]
    lines.append("|" + "---|" * (6 + len(labels)))
    for key, times in best.items():
        first = times.get(labels[0])
        cells = []
        for label in labels:
            t = times.get(label)
            if t is None:
                cells.append("")
            elif first is None or label == labels[0]:
                cells.append(f"{t:.1f}")
            else:
                cells.append(f"{t:.1f} ({t / first:.2f}x)")
        lines.append("| " + " | ".join(str(k) for k in key) + " | " + " | ".join(cells) + " |")
    errors = {label: max((r["rel_err"] or 0.0) for r in rows if r["label"] == label) for label in labels}
    lines.append("")
    lines.append("max rel err: " + ", ".join(f"{label} {err:.1e}" for label, err in errors.items()))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--label")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--no-check", action="store_true", help="time only (skip the fp32 reference)")
    parser.add_argument("--cases", default="", help="indices into TREE_CASES, comma- or space-separated (default: all)")
    parser.add_argument(
        "--shapes", default="", help="more cases: BSxPREFIXxQLENxHEADS[:fp8], comma- or space-separated"
    )
    parser.add_argument("--interleave", action="store_true", help="a foreign kernel before every call")
    parser.add_argument("--summarize", type=Path, help="print the table of an ab.jsonl and exit")
    parser.add_argument("--check-args", action="store_true", help="only read --cases and --shapes, then exit")
    args = parser.parse_args()
    if args.summarize is not None:
        print(summarize(args.summarize))
        return
    try:
        picked = parse_cases(args.cases)
        extra = parse_shapes(args.shapes)
    except ValueError as exc:
        parser.error(str(exc))
    if args.check_args:
        return
    if args.label is None or args.out is None:
        parser.error("--label and --out are required unless --summarize or --check-args")
    shapes: list[Shape] = (
        [(*case, False) for i, case in enumerate(TREE_CASES) if not picked or i in picked]
        if args.cases or not args.shapes
        else []
    )
    shapes += extra
    scratch = torch.ones(FOREIGN_ELEMENTS, device="cuda")
    foreign_us = graph_time_us([lambda: scratch.mul_(1.0)]) if args.interleave else 0.0
    with args.out.open("a") as out:
        for i, (bs, prefix, q_len, heads, fp8) in enumerate(shapes):
            kv_dtype = torch.float8_e4m3fn if fp8 else torch.bfloat16
            r = CaseRunner(bs, prefix, q_len, heads, "tree", seed=1000 * i, kv_dtype=kv_dtype)
            # Twice the planned workspace: a saved base build may predate the bf16 partials (fp32 rows, ~2x the
            # bytes), and its binding refuses a smaller one.
            r.ws = torch.empty(2 * r.ws.numel(), dtype=torch.uint8, device="cuda")
            c = r.c
            err = None
            if not args.no_check:
                r.ours(c)()
                ref = c.reference(SM_SCALE)
                err = rel_error(r.out, ref)
                del ref
            # AB_HOT_Q=1 (module docstring): every input set shares set 0's Q.
            sets = [dataclasses.replace(x, q=c.q) for x in r.cases] if os.environ.get("AB_HOT_Q") == "1" else r.cases
            calls = [r.ours(x) for x in sets]
            us = graph_time_us(with_foreign(calls, scratch) if args.interleave else calls) - foreign_us
            rec = {
                "label": args.label,
                "bs": bs,
                "prefix": prefix,
                "q_len": q_len,
                "heads": heads,
                "kv": "fp8" if fp8 else "bf16",
                "interleave": args.interleave,
                "us": round(us, 2),
                "rel_err": err,
            }
            print(json.dumps(rec), flush=True)
            out.write(json.dumps(rec) + "\n")
            del r
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
