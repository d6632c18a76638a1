"""What each speed target of the kernel issue asks of the tensor cores, from a committed benchmark run.

    python kernel/bench/target_rates.py   # results/h200/results.{json,extra.json} -> targets.{json,md} beside it

For every tree case of the run and every target that case misses, the time the target allows and the mma.sync
rate that time demands: the case's flops over 16-row tiles (the kernel's mma granularity: 72 rows run as 80),
divided by the allowed time, as a fraction of the mma.sync ceiling measured in the same run. No GPU needed.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path

from gpu_tag import results_dir

ROWS_PER_TILE = 16  # rows of one m16n8k16 tile
# The targets (H200).
GEOMEAN_TARGET = 30.0
MIN_SPEEDUP_TARGET = 8.0
ROOFLINE_TARGET = 0.70
ROOFLINE_MIN_KV_TOKENS = 256 * 1024
BS1_TARGET_US = 15.0
BS1_MAX_PREFIX = 32768


@dataclass(frozen=True)
class TargetDemand:
    """One target a case misses: the time it allows and the tensor rate that time needs."""

    target: str
    bs: int
    prefix: int
    q_len: int
    heads: int
    now_us: float
    allowed_us: float
    mma_frac_now: float  # executed mma rate now, fraction of the measured mma.sync ceiling
    mma_frac_needed: float


def mma_row_factor(q_len: int, heads: int) -> float:
    """Rows the mma computes per live row: a request's q_len * heads rows run in whole 16-row tiles."""
    rows = q_len * heads
    return math.ceil(rows / ROWS_PER_TILE) * ROWS_PER_TILE / rows


def allowed_times(case: dict, kv_tokens: int, floor_us: float, uniform: float) -> dict[str, float]:
    """Time each missed target allows this case (targets it meets or that do not apply are left out)."""
    out: dict[str, float] = {}
    if uniform > 1.0:
        out["geomean"] = case["kernel_us"] / uniform
    if case["speedup"] < MIN_SPEEDUP_TARGET:
        out["min speedup"] = case["triton_us"] / MIN_SPEEDUP_TARGET
    if kv_tokens >= ROOFLINE_MIN_KV_TOKENS and case["roofline_frac"] < ROOFLINE_TARGET:
        out["roofline"] = floor_us / ROOFLINE_TARGET
    if case["bs"] == 1 and case["prefix"] <= BS1_MAX_PREFIX and case["kernel_us"] > BS1_TARGET_US:
        out["bs 1"] = BS1_TARGET_US
    return out


def demands(result: dict, extra: dict) -> tuple[float, list[TargetDemand]]:
    """(uniform speed-up the geomean target needs, every missed target of every tree case)."""
    pairs = [(c, e) for c, e in zip(result["cases"], extra["cases"], strict=True) if c["mask"] == "tree"]
    uniform = GEOMEAN_TARGET / statistics.geometric_mean(c["speedup"] for c in result["cases"])
    out = []
    for c, e in pairs:
        frac_now = e["TFLOPs"] * mma_row_factor(c["q_len"], c["H"]) / result["mma_TFLOPs"]
        for target, allowed in allowed_times(c, e["kv_tokens"], e["floor_us"], uniform).items():
            out.append(
                TargetDemand(
                    target,
                    c["bs"],
                    c["prefix"],
                    c["q_len"],
                    c["H"],
                    c["kernel_us"],
                    round(allowed, 1),
                    round(frac_now, 3),
                    round(frac_now * c["kernel_us"] / allowed, 3),
                )
            )
    return uniform, out


def markdown(result: dict, uniform: float, rows: list[TargetDemand]) -> str:
    targets = ["geomean", "min speedup", "roofline", "bs 1"]
    by_case: dict[tuple, dict[str, TargetDemand]] = {}
    for d in rows:
        by_case.setdefault((d.bs, d.prefix, d.q_len, d.heads), {})[d.target] = d
    lines = [
        f"# What the speed targets ask of the tensor cores ({result['device']})",
        "",
        f"`kernel/bench/target_rates.py` over `results.json`: mma.sync ceiling {result['mma_TFLOPs']:.0f} "
        f"TFLOP/s, copy {result['copy_GBps']} GB/s, both measured in that run. Per tree case: the executed mma rate "
        "now (flops over 16-row tiles, as a share of the ceiling), and for each target the case misses, the time it "
        "allows and the share of the ceiling that time needs. Targets: geomean >= 30x over Triton (every case "
        f"{uniform:.2f}x faster), no case below 8x, >= 70% of the roofline at >= 256k KV tokens, bs = 1 <= 15 us.",
        "",
        "| bs | prefix | q_len | H | now us | mma now | " + " | ".join(targets) + " |",
        "|---|---|---|---|---|---|" + "---|" * len(targets),
    ]
    for (bs, prefix, q_len, heads), ds in by_case.items():
        first = next(iter(ds.values()))
        cells = [f"{ds[t].allowed_us:g} us: {ds[t].mma_frac_needed:.0%}" if t in ds else "" for t in targets]
        lines.append(
            f"| {bs} | {prefix} | {q_len} | {heads} | {first.now_us:g} | {first.mma_frac_now:.0%} | "
            + " | ".join(cells)
            + " |"
        )
    lines += [
        "",
        "At bs = 1 with short prefixes the shares are small because such a call is mostly a fixed chain (two kernel "
        "launches, the dependent index, pool-row and key loads, the combine), not tensor work: "
        "`splits.md` breaks it down.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--results", type=Path, default=results_dir() / "results.json")
    parser.add_argument("--out", type=Path, default=results_dir() / "targets.json")
    args = parser.parse_args(argv)
    result = json.loads(args.results.read_text())
    extra = json.loads(args.results.with_suffix(".extra.json").read_text())
    uniform, rows = demands(result, extra)
    args.out.write_text(
        json.dumps({"uniform_speedup_for_geomean": round(uniform, 3), "demands": [asdict(d) for d in rows]}, indent=1)
        + "\n"
    )
    args.out.with_suffix(".md").write_text(markdown(result, uniform, rows))
    print(args.out.with_suffix(".md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
