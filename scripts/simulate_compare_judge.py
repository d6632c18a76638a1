"""The comparison judge's power and false-FAIL rate, simulated through the judge itself (docs/gate.md "The
statistics"; issue 48), and the testbed's own noise measured from A/A deploys.

    .venv/bin/python scripts/simulate_compare_judge.py simulate [--draws 10000] [--testbed-noise docs/bench/compare-noise.json]
    .venv/bin/python scripts/simulate_compare_judge.py measure RECORDS.jsonl... > docs/bench/compare-noise.json
    .venv/bin/python scripts/simulate_compare_judge.py aa HOST N RECORDS.jsonl [TREE]   # A/A deploys on the testbed

``simulate``: every draw builds two (or, with the confirmation, three) samples of 16 prompts and calls the real
``opsctl.comparison.compare.compare`` (and ``confirm`` after a speed-only FAIL, as a deploy does); the unpaired judge of
before issue 48 (median ratio, one-sided Mann-Whitney U over per-request times, the same bound) is run on the same
draws beside it. The noise model, in log time per verify step of prompt i on a side s:

    log t[s, i] = prompt[i] + shift[s] + noise[s, i] + log(1 / (1 - slowdown)) on the new side

``prompt[i]`` ~ N(0, 0.2) (the spread between prompts: accepted drafts differ), ``shift[s]`` ~ N(0, side) once per
side (a whole side faster or slower: the host's state, the minutes between the sides), ``noise[s, i]`` ~
N(0, paired / sqrt(2)) so that a pair's log ratio has the spread ``paired``. The issue's model: paired 2%, side
2%; the testbed's: the spread and the side shift measured by ``measure`` (A/A deploys). A slowdown of 12% is the
new release decoding at 0.88x the old one's speed.

``measure``: reads the records ``aa`` wrote (one A/A deploy a line: the baseline and candidate samples) and prints
the per-prompt paired log-ratio spread (the standard deviation of log(new / old) around its median within a sample
pair, per level) and the whole-side shift (the median log ratio of each A/A pair: its standard deviation between
pairs is the shift between two sides; one side's is that over sqrt(2)).

NumPy draws the noise (a test dependency; opsctl itself never imports it).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from opsctl.comparison.compare import compare, confirm, needs_another_sample  # noqa: E402
from opsctl.comparison.mannwhitney import mann_whitney_greater  # noqa: E402
from opsctl.comparison.results import Outcome  # noqa: E402
from opsctl.comparison.sample import CompareRequest, ComparisonSample  # noqa: E402
from opsctl.inventory import CompareSettings  # noqa: E402

PROMPTS = 16
PROMPT_SPREAD = 0.2  # log spread between prompts (0.18-0.23 measured on the testbed, issue 48)
SLOWDOWNS = (0.0, 0.04, 0.06, 0.08, 0.10, 0.12, 0.14, 0.16, 0.20, 0.25, 0.30, 0.40)
TOKENS = 4  # output ids per request: identical on both sides (the pairs), few so that a draw is cheap


def sample(times: np.ndarray) -> ComparisonSample:
    return ComparisonSample(
        tuple(
            CompareRequest(output_ids=(i, 1, 2, 3), decode_s_per_token=float(t), ttft_s=0.1, completion_tokens=TOKENS)
            for i, t in enumerate(times)
        )
    )


def draw_side(rng: np.random.Generator, prompt: np.ndarray, side: float, paired: float, slowdown: float) -> np.ndarray:
    shift = rng.normal(0.0, side)
    noise = rng.normal(0.0, paired / math.sqrt(2), size=PROMPTS)
    return 0.02 * np.exp(prompt + shift + noise) / (1.0 - slowdown)


def unpaired_fails(old: np.ndarray, new: np.ndarray, settings: CompareSettings) -> bool:
    """The judge before issue 48: ratio of the medians below 1 - max_slowdown and Mann-Whitney p < alpha."""
    ratio = float(np.median(old) / np.median(new))
    return ratio < 1 - settings.max_slowdown and mann_whitney_greater(new.tolist(), old.tolist()).p < settings.alpha


def simulate(
    draws: int,
    side: float,
    paired: float,
    slowdown: float,
    settings: CompareSettings,
    unpaired: CompareSettings,
    seed: int,
) -> dict[str, float]:
    rng = np.random.default_rng(seed)
    first = confirmed = unproven = first_u = confirmed_u = 0
    for _ in range(draws):
        prompt = rng.normal(0.0, PROMPT_SPREAD, size=PROMPTS)
        old = draw_side(rng, prompt, side, paired, 0.0)
        new = draw_side(rng, prompt, side, paired, slowdown)
        again = draw_side(rng, prompt, side, paired, slowdown)  # the confirmation's sample (same baseline)
        a, b = sample(old), sample(new)
        result = compare(a, b, settings)
        first += result.outcome is Outcome.FAIL
        if needs_another_sample(result):
            result = confirm(result, compare(a, sample(again), settings))
        confirmed += result.outcome is Outcome.FAIL
        unproven += result.outcome is Outcome.UNPROVEN  # not proven after the second sample: rolled back, not marked
        if unpaired_fails(old, new, unpaired):
            first_u += 1
            confirmed_u += unpaired_fails(old, again, unpaired)
    return {
        "slowdown": slowdown,
        "draws": draws,
        "fail_first": first / draws,
        "fail_confirmed": confirmed / draws,
        "unproven_confirmed": unproven / draws,
        "unpaired_fail_first": first_u / draws,
        "unpaired_fail_confirmed": confirmed_u / draws,
    }


def smallest_detected(rows: list[dict[str, float]], key: str, at: float = 0.95) -> float | None:
    """The smallest simulated slowdown detected at least ``at`` of the time (and every larger one too)."""
    found = None
    for row in sorted(rows, key=lambda r: -r["slowdown"]):
        if row["slowdown"] > 0 and row[key] >= at:
            found = row["slowdown"]
        elif row["slowdown"] > 0:
            break
    return found


def run_simulate(args: argparse.Namespace) -> None:
    settings = CompareSettings() if args.max_slowdown is None else CompareSettings(max_slowdown=args.max_slowdown)
    unpaired = CompareSettings(max_slowdown=0.10, alpha=0.01)  # the defaults before issue 48
    models: list[dict[str, Any]] = [{"name": "issue 48 model (GPU host, CUDA graphs)", "side": 0.02, "paired": 0.02}]
    if args.testbed_noise:
        noise = json.loads(Path(args.testbed_noise).read_text())
        for level in noise["levels"]:
            models.append(
                {
                    "name": f"testbed, concurrency {level['concurrency']}",
                    "side": level["side_shift_sd"],
                    "paired": level["paired_spread_median"],
                }
            )
    out: dict[str, Any] = {
        "settings": {"max_slowdown": settings.max_slowdown, "alpha": settings.alpha, "prompts": PROMPTS},
        "unpaired_settings": {"max_slowdown": unpaired.max_slowdown, "alpha": unpaired.alpha},
        "prompt_spread": PROMPT_SPREAD,
        "models": [],
    }
    for m, model in enumerate(models):
        started = time.monotonic()
        rows = [
            simulate(args.draws, model["side"], model["paired"], s, settings, unpaired, seed=1000 * m + k)
            for k, s in enumerate(SLOWDOWNS)
        ]
        entry = {
            **model,
            "rows": rows,
            "smallest_95_first": smallest_detected(rows, "fail_first"),
            "smallest_95_confirmed": smallest_detected(rows, "fail_confirmed"),
            "unpaired_smallest_95_first": smallest_detected(rows, "unpaired_fail_first"),
            "unpaired_smallest_95_confirmed": smallest_detected(rows, "unpaired_fail_confirmed"),
            "seconds": round(time.monotonic() - started, 1),
        }
        out["models"].append(entry)
        print(f"{model['name']}: done in {entry['seconds']}s", file=sys.stderr)
    text = json.dumps(out, indent=2)
    if args.json:
        Path(args.json).write_text(text + "\n")
    if args.markdown:
        Path(args.markdown).write_text(markdown(out))
    print(text)


def markdown(out: dict[str, Any]) -> str:
    s = out["settings"]
    lines = [
        "# The comparison's judge, simulated (scripts/simulate_compare_judge.py)",
        "",
        f"Paired judge at max_slowdown {s['max_slowdown']}, alpha {s['alpha']}, {s['prompts']} prompts; the unpaired "
        f"judge of before issue 48 (max_slowdown {out['unpaired_settings']['max_slowdown']}, alpha "
        f"{out['unpaired_settings']['alpha']}) on the same draws. FAIL rates: first sample / with the confirmation "
        "(a speed-only FAIL measured again against the same baseline). Slowdown 0 is A/A (false FAIL). "
        "UNPROVEN: a slowdown beyond the bound measured on both samples but within their noise (or withheld): "
        "never a PASS, rolled back without marking the release bad.",
        "",
    ]
    for model in out["models"]:
        lines += [
            f"## {model['name']}: paired spread {model['paired']:.3f}, whole-side shift {model['side']:.3f} (log, sd)",
            "",
            "| slowdown | paired: first | paired: confirmed | paired: UNPROVEN | unpaired: first | unpaired: confirmed |",
            "|---|---|---|---|---|---|",
        ]
        for r in model["rows"]:
            lines.append(
                f"| {r['slowdown']:.0%} | {r['fail_first']:.2%} | {r['fail_confirmed']:.2%} | "
                f"{r.get('unproven_confirmed', 0.0):.2%} | "
                f"{r['unpaired_fail_first']:.2%} | {r['unpaired_fail_confirmed']:.2%} |"
            )

        def pct(v: float | None) -> str:
            return f"{v:.0%}" if v is not None else f"> {SLOWDOWNS[-1]:.0%}"

        lines += [
            "",
            f"Smallest slowdown detected 95% of the time: paired {pct(model['smallest_95_first'])} (first sample), "
            f"{pct(model['smallest_95_confirmed'])} (confirmed); unpaired {pct(model['unpaired_smallest_95_first'])}"
            f" / {pct(model['unpaired_smallest_95_confirmed'])}. {model['rows'][0]['draws']:,} draws a row.",
            "",
        ]
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------ the testbed


def _pairs(old: list[dict[str, Any]], new: list[dict[str, Any]], level: int | None) -> list[float]:
    out = []
    for a, b in zip(old, new, strict=True):
        if a.get("concurrency") != level or a["output_ids"] != b["output_ids"]:
            continue
        if a.get("decode_s") and b.get("decode_s") and a.get("spec_verify_ct") and b.get("spec_verify_ct"):
            out.append(math.log((b["decode_s"] / b["spec_verify_ct"]) / (a["decode_s"] / a["spec_verify_ct"])))
        elif a.get("decode_s_per_token") and b.get("decode_s_per_token"):
            out.append(math.log(b["decode_s_per_token"] / a["decode_s_per_token"]))
    return out


def run_measure(args: argparse.Namespace) -> None:
    records = [json.loads(line) for path in args.records for line in Path(path).read_text().splitlines() if line]
    pairs = []
    for r in records:
        if r.get("baseline") and r.get("candidate"):
            pairs.append((r["baseline"]["requests"], r["candidate"]["requests"]))
            if r.get("first_candidate"):
                pairs.append((r["baseline"]["requests"], r["first_candidate"]["requests"]))
    levels = sorted({q.get("concurrency") for old, _ in pairs for q in old}, key=lambda v: v or 0)
    out: dict[str, Any] = {"pairs": len(pairs), "levels": []}
    for level in levels:
        spreads, shifts, identical_ct = [], [], 0
        for old, new in pairs:
            d = _pairs(old, new, level)
            if len(d) < 5:
                continue
            m = statistics.median(d)
            shifts.append(m)
            spreads.append(statistics.pstdev([v - m for v in d]))
            identical_ct += all(
                a.get("spec_verify_ct") == b.get("spec_verify_ct")
                for a, b in zip(old, new, strict=True)
                if a.get("concurrency") == level
            )
        between = statistics.pstdev(shifts) if len(shifts) > 1 else None
        out["levels"].append(
            {
                "concurrency": level,
                "pairs": len(shifts),
                "spec_verify_ct_identical_pairs": identical_ct,
                "paired_spreads": [round(v, 4) for v in spreads],
                "paired_spread_median": round(statistics.median(spreads), 4),
                "shifts": [round(v, 4) for v in shifts],
                "shift_between_sides_sd": round(between, 4) if between is not None else None,
                # One side's shift: the difference of two independent sides has sqrt(2) times its spread.
                "side_shift_sd": round(between / math.sqrt(2), 4) if between is not None else None,
                "shift_abs_max": round(max(abs(v) for v in shifts), 4),
            }
        )
    print(json.dumps(out, indent=2))


def run_aa(args: argparse.Namespace) -> None:
    """A/A deploys of one tree on a testbed host (the pre-restart speed check off, as the comparison's tests
    run): one JSON line a deploy with the samples, the line and the step times."""
    from opsctl import pipeline as d
    from opsctl.inventory.loader import load
    from opsctl.testbed import variants

    host = load(None).host(args.host)
    gate = host.gate.model_copy(update={"speed": host.gate.speed.model_copy(update={"enabled": False})})
    host = host.model_copy(update={"gate": gate})
    tree = Path(args.tree) if args.tree else variants.copy_tree(REPO, Path(args.records).with_suffix(".tree"), "aa")
    with open(args.records, "a") as f:
        for i in range(args.n):
            res = d.deploy(host, tree, d.DeployOptions(force=True))
            c = res.comparison or {}
            doc = {
                "verdict": res.verdict,
                "elapsed_s": res.elapsed_s,
                "steps": res.step_times,
                "line": c.get("line"),
                **{k: c.get(k) for k in ("baseline", "candidate", "first_candidate")},
            }
            f.write(json.dumps(doc) + "\n")
            f.flush()
            print(i, res.verdict, f"{res.elapsed_s:.1f}s", c.get("line"), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("simulate")
    s.add_argument("--draws", type=int, default=10_000)
    s.add_argument("--max-slowdown", type=float, default=None, help="the paired judge's (default: the inventory's)")
    s.add_argument("--testbed-noise", help="the JSON `measure` printed")
    s.add_argument("--json", help="write the results here")
    s.add_argument("--markdown", help="write the table here")
    s.set_defaults(func=run_simulate)
    m = sub.add_parser("measure")
    m.add_argument("records", nargs="+")
    m.set_defaults(func=run_measure)
    a = sub.add_parser("aa")
    a.add_argument("host")
    a.add_argument("n", type=int)
    a.add_argument("records")
    a.add_argument("tree", nargs="?")
    a.set_defaults(func=run_aa)
    args = parser.parse_args()
    args.func(args)


if __name__ == "__main__":
    main()
