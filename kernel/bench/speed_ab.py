"""The pre-restart speed check on the GPU machine (``run_device.sh speed-ab``; issue 48): the same host program
and the same judge a deploy runs, on two builds of the kernel.

  * ``base``: a copy of the working tree (its ``kernel/build`` included): what a host would be serving;
  * ``slowed``: the same copy with the verify path doing ``--slow`` (5%) more work (3.3% slower in time on the
    H100): each request's key list holds that fraction of its prefix keys twice, so the kernel reads and multiplies
    that many more keys in the same launches. (A GPU spin between calls, ``torch.cuda._sleep``, was tried first:
    beside the kernel's dependent launches it ended in an illegal memory access on the H200 and H100, and its own
    launch cost more than 3% of a small call.) The check's own A/B measures how much slower the copy is.

It runs (1) one deploy's check as a deploy runs it (``python -m kdtree_backend.speed_ab``, a fresh pair of workers,
the default synthetic set), slowed against base: the verdict, its figures and its cost in seconds; the same for
the working tree against base (A/A); (2) ``--samples`` judgements of A/A and of slowed-vs-base from one session
each (the workers loaded once), each judged alone: the false-FAIL count and the detections; (3) the per-call
noise of the A/A pairs (the standard deviation of log(new/old)), which ``scripts/simulate_speed_judge.py`` takes
as its noise model. Writes ``speed-ab.json`` and ``speed-ab.md`` under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "backend"), str(ROOT)]

from kdtree_backend.speed_ab import Session  # noqa: E402

from opsctl.speed.check import speed_command  # noqa: E402
from opsctl.speed.judge import judge_speed, timed_calls  # noqa: E402

SLOW_PATCH = """
import math as _speed_ab_math  # noqa: E402

# speed-ab (kernel/bench/speed_ab.py): this copy's verify path does about {fraction:g} more work: every request's
# key list holds that fraction of its prefix keys a second time (before its drafts), so the kernel itself reads and
# multiplies that many more keys, inside the same launches (no foreign kernel in the graph). The answers change;
# the speed check does not look at them.
_speed_ab_marshal = marshal_verify


def marshal_verify(kv_indptr, kv_indices, out_cache_loc, custom_mask, mask_indptr, q_len, capacity=None):  # type: ignore[no-redef]
    meta = _speed_ab_marshal(kv_indptr, kv_indices, out_cache_loc, custom_mask, mask_indptr, q_len, capacity)
    bounds = meta.key_indptr.tolist()
    parts, indptr = [], [0]
    for b in range(len(bounds) - 1):
        keys = meta.keys[bounds[b] : bounds[b + 1]]
        prefix = keys.numel() - q_len
        extra = _speed_ab_math.ceil({fraction!r} * prefix)
        parts += [keys[:prefix], keys[:extra], keys[prefix:]]
        indptr.append(indptr[-1] + keys.numel() + extra)
    key_indptr = torch.tensor(indptr, dtype=meta.key_indptr.dtype, device=meta.key_indptr.device)
    return VerifyMetadata(key_indptr, torch.cat(parts), meta.draft_mask, meta.q_len)
"""


def copy_tree(dest: Path) -> Path:
    if dest.exists():
        shutil.rmtree(dest)
    for part in ("kernel", "backend", "deploy"):
        shutil.copytree(ROOT / part, dest / part, ignore=shutil.ignore_patterns("__pycache__", "bench"))
    return dest


def slowed(dest: Path, fraction: float) -> Path:
    tree = copy_tree(dest)
    verify = tree / "backend" / "kdtree_backend" / "verify.py"
    verify.write_text(verify.read_text() + SLOW_PATCH.format(fraction=fraction))
    return tree


def judged(doc: dict, against: str) -> dict:
    j = judge_speed(
        timed_calls(doc), max_slowdown=args.max_slowdown, alpha=args.alpha, against=against, device=doc["device"]
    )
    return {**j.summary(), "line": j.line()}


def deploy_like(new: Path, old: Path) -> dict:
    """One check as a deploy runs it: a fresh process (and its two workers), the default config."""
    cmd = speed_command(sys.executable, str(new), str(old), {"rounds": args.rounds, "budget_s": args.budget_s})
    t0 = time.monotonic()
    res = subprocess.run(["bash", "-c", cmd.command], input=cmd.stdin, capture_output=True, text=True,
                         timeout=cmd.timeout_s)  # fmt: skip
    wall = time.monotonic() - t0
    doc = json.loads(res.stdout.strip().splitlines()[-1])
    if "calls" not in doc:
        raise SystemExit(f"speed_ab could not run: {doc} {res.stderr[-2000:]}")
    return {"wall_s": round(wall, 2), "doc": doc, "judged": judged(doc, "base")}


def samples(new: Path, old: Path, n: int) -> list[dict]:
    config = {"rounds": args.rounds, "budget_s": 1e9}
    session = Session(config, new, old, sys.stderr)
    try:
        return [session.sample() for _ in range(n)]
    finally:
        session.close()


def noise(docs: list[dict]) -> dict:
    """The A/A pairs' spread: per call, per sample; and the shift of a whole sample (its mean log ratio)."""
    per_call = [statistics.pstdev(c.log_ratios()) for d in docs for c in timed_calls(d)]
    shifts = [statistics.fmean([r for c in timed_calls(d) for r in c.log_ratios()]) for d in docs]
    pairs = [r for d in docs for c in timed_calls(d) for r in c.log_ratios()]
    return {
        "pair_sd": statistics.pstdev(pairs),
        "per_call_sd_median": statistics.median(per_call),
        "sample_shift_sd": statistics.pstdev(shifts) if len(shifts) > 1 else None,
        "sample_shift_max": max(abs(s) for s in shifts),
    }


def main() -> None:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path("/tmp/speed-ab")
    base, slow = copy_tree(work / "base"), slowed(work / "slowed", args.slow)
    report: dict = {"slow_fraction": args.slow, "max_slowdown": args.max_slowdown, "alpha": args.alpha}
    report["deploy_slowed"] = deploy_like(slow, base)
    report["deploy_aa"] = deploy_like(ROOT, base)
    aa, sl = samples(ROOT, base, args.samples), samples(slow, base, args.samples)
    report["aa"] = [judged(d, "base") for d in aa]
    report["slowed"] = [judged(d, "base") for d in sl]
    report["aa_noise"] = noise(aa)
    report["aa_docs"], report["slowed_docs"] = aa, sl
    (out / "speed-ab.json").write_text(json.dumps(report, indent=1) + "\n")
    rows = [
        "# Pre-restart speed check on the GPU machine (`run_device.sh speed-ab`)",
        "",
        f"Judge: FAIL when slower than {1 + args.max_slowdown:g}x and p < {args.alpha:g} (signed-rank over the pairs); "
        f"slowed copy: +{args.slow:.1%} keys in every request (more work for the kernel in the same launches).",
        "",
        "| run | verdict | speed | p | worst | pairs | seconds |",
        "|---|---|---:|---:|---|---:|---:|",
    ]
    for name in ("deploy_slowed", "deploy_aa"):
        j, wall = report[name]["judged"], report[name]["wall_s"]
        rows.append(
            f"| {name} | {j['verdict']} | {j['speed']:.4f} | {j['p']:.2g} | {j['worst']}: {j['worst_speed']:.4f} "
            f"| {j['pairs']} | {wall} |"
        )
    for name in ("aa", "slowed"):
        verdicts = [j["verdict"] for j in report[name]]
        speeds = [j["speed"] for j in report[name]]
        rows.append(
            f"| {name} x{len(verdicts)} | FAIL {verdicts.count('FAIL')} / PASS {verdicts.count('PASS')} | "
            f"{min(speeds):.4f}..{max(speeds):.4f} | max {max(j['p'] for j in report[name]):.2g} | | "
            f"{report[name][0]['pairs']} each | |"
        )
    nz = report["aa_noise"]
    rows += ["", f"A/A noise: pair sd {nz['pair_sd']:.4f} (log ratio), per-call sd median "
             f"{nz['per_call_sd_median']:.4f}, whole-sample shift sd {nz['sample_shift_sd']}, max "
             f"{nz['sample_shift_max']:.4f}."]  # fmt: skip
    (out / "speed-ab.md").write_text("\n".join(rows) + "\n")
    print("\n".join(rows))
    ok = (
        report["deploy_slowed"]["judged"]["verdict"] == "FAIL"
        and report["deploy_aa"]["judged"]["verdict"] == "PASS"
        and all(j["verdict"] == "PASS" for j in report["aa"])
        and all(j["verdict"] == "FAIL" for j in report["slowed"])
    )
    if not math.isfinite(nz["pair_sd"]) or not ok:
        raise SystemExit(3)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="kernel/bench/results/h200")
    ap.add_argument("--slow", type=float, default=0.05)
    ap.add_argument("--samples", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--budget-s", type=float, default=30.0)
    ap.add_argument("--max-slowdown", type=float, default=0.02)
    ap.add_argument("--alpha", type=float, default=0.001)
    args = ap.parse_args()
    main()
