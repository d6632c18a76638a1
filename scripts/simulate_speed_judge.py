"""Power and false-FAIL rate of the pre-restart speed check's judge (``opsctl.speed.judge.judge_speed``, the function
a deploy calls), by simulation through the judge itself (docs/gate.md "The pre-restart speed check").

Noise model: every pair of a call in a round is ``log(new / old) = log(1 + slowdown) + s + b + e``: ``e ~ N(0,
pair_sd)`` independent between pairs (what alternating A B / B A leaves: a drift of the host falls on both sides of
a pair); ``b ~ N(0, call_sd)`` fixed per call for the sample (a shape where the two processes differ by chance: a
memory placement); ``s ~ N(0, side_sd)`` fixed for the whole sample (one process placed better than the other). The figures measured for ``pair_sd`` and ``call_sd``: the GPU
machine's A/A pairs (kernel/bench/results/h100/speed-ab.json, ``aa_noise``) and the testbed's.

    .venv/bin/python scripts/simulate_speed_judge.py            # writes docs/bench/speed-judge.{json,md}
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from opsctl.speed.judge import SpeedVerdict, TimedCall, judge_speed  # noqa: E402

SLOWDOWNS = (0.0, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.10)


def draw(
    rnd: random.Random, calls: int, rounds: int, slowdown: float, pair_sd: float, call_sd: float, side_sd: float
) -> list:
    import math

    out = []
    side = rnd.gauss(0.0, side_sd)
    for i in range(calls):
        bias = side + rnd.gauss(0.0, call_sd)
        old = tuple(100.0 * math.exp(rnd.gauss(0.0, 0.01)) for _ in range(rounds))
        new = tuple(o * (1 + slowdown) * math.exp(bias + rnd.gauss(0.0, pair_sd)) for o in old)
        out.append(TimedCall(1 + i, 1024, 9, 8, new, old))
    return out


def fail_rate(args: argparse.Namespace, model: dict, slowdown: float, seed: int) -> float:
    rnd = random.Random(seed)
    fails = 0
    for _ in range(args.draws):
        calls = draw(
            rnd, model["calls"], model["rounds"], slowdown, model["pair_sd"], model["call_sd"], model["side_sd"]
        )
        j = judge_speed(calls, max_slowdown=args.max_slowdown, alpha=args.alpha, against="old")
        fails += j.verdict is SpeedVerdict.FAIL
    return fails / args.draws


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--draws", type=int, default=10_000)
    ap.add_argument("--max-slowdown", type=float, default=0.02)
    ap.add_argument("--alpha", type=float, default=0.001)
    ap.add_argument("--model", action="append", default=[], help="NAME:CALLS:ROUNDS:PAIR_SD:CALL_SD:SIDE_SD")
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "bench" / "speed-judge.json")
    args = ap.parse_args()
    models = [
        dict(zip(("name", "calls", "rounds", "pair_sd", "call_sd", "side_sd"), m.split(":"), strict=True))
        for m in args.model
    ]
    for m in models:
        m.update(calls=int(m["calls"]), rounds=int(m["rounds"]))
        m.update({k: float(m[k]) for k in ("pair_sd", "call_sd", "side_sd")})
    results = []
    for k, m in enumerate(models):
        rates = {f"{s:g}": fail_rate(args, m, s, seed=1000 * k + i) for i, s in enumerate(SLOWDOWNS)}
        smallest = next((s for s in SLOWDOWNS if rates[f"{s:g}"] >= 0.95), None)
        results.append({**m, "fail_rate": rates, "smallest_detected_95": smallest})
        print(m["name"], rates, "95% from", smallest)
    doc = {"draws": args.draws, "max_slowdown": args.max_slowdown, "alpha": args.alpha, "models": results}
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    head = (
        "| model | calls x rounds | pair sd | call sd | side sd | " + " | ".join(f"{s:.1%}" for s in SLOWDOWNS) + " |"
    )
    rows = [
        "# The pre-restart speed check's judge, simulated",
        "",
        f"FAIL rate of `opsctl.speed.judge.judge_speed` over {args.draws:,} draws per cell (max_slowdown "
        f"{args.max_slowdown:g}, alpha {args.alpha:g}); the 0.0% column is the A/A false-FAIL rate. Made by "
        "`scripts/simulate_speed_judge.py` (noise model in its docstring).",
        "",
        head,
        "|---|---|---:|---:|---:|" + "---:|" * len(SLOWDOWNS),
    ]
    for r in results:
        cells = " | ".join(f"{r['fail_rate'][f'{s:g}']:.2%}" for s in SLOWDOWNS)
        rows.append(
            f"| {r['name']} | {r['calls']} x {r['rounds']} | {r['pair_sd']:g} | {r['call_sd']:g} | {r['side_sd']:g} "
            f"| {cells} |"
        )
    args.out.with_suffix(".md").write_text("\n".join(rows) + "\n")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
