"""Whole deploys on a testbed host, judged by both speed checks, counted (docs/gate.md "The pre-restart speed
check" and "The statistics"): what CI's tests check once, repeated, with each deploy's figures and cost.

  * pre-restart: ``slow:1.1`` (a verify path 1.1x as slow) must be refused before the restart, every time; the same
    code under another id (A/A) must pass it, every time;
  * comparison (the pre-restart check off, concurrency 1 and 8): ``slow:1.25`` must FAIL at the comparison, the
    running release deployed again (A/A) must PASS;
  * the cost: the deploy's seconds, and the speed step's and the comparison's.

    bash scripts/setup.sh && .venv/bin/opsctl testbed up     # once
    .venv/bin/python scripts/measure_testbed_speed.py          # writes docs/bench/testbed-speed.{json,md}

Only the testbed's hosts (its own inventory, ``OPSCTL_TESTBED_DIR``): never a host of inventory.yaml. It leaves the
host on a good release of this tree.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from opsctl import pipeline as d  # noqa: E402
from opsctl.inventory import HostConfig  # noqa: E402
from opsctl.testbed import variants  # noqa: E402
from opsctl.testbed.statedir import StateDir  # noqa: E402


def configured(host: HostConfig, *, speed: bool, levels: list[int] | None) -> HostConfig:
    """``host`` with the pre-restart check on or off and the comparison at ``levels`` (None: off)."""
    gate = host.gate
    compare = gate.compare.model_copy(update={"enabled": levels is not None, "concurrency": levels or [1]})
    gate = gate.model_copy(update={"speed": gate.speed.model_copy(update={"enabled": speed}), "compare": compare})
    return host.model_copy(update={"gate": gate})


def over_good(host: HostConfig, good: Path) -> list[str]:
    """The good release deployed until it PASSes (its own comparison may be withheld: UNPROVEN rolls back to what
    ran before, and the next case would be compared with that); its verdicts, in order."""
    verdicts = []
    for _ in range(3):
        verdicts.append(str(d.deploy(host, good, d.DeployOptions(force=True)).verdict))
        if verdicts[-1] == "PASS":
            return verdicts
    raise SystemExit(f"the good release did not PASS on {host.name} in 3 deploys: {verdicts}")


def one(host: HostConfig, tree: Path, good: Path) -> dict[str, Any]:
    """Deploy ``tree`` over the good release (forced: a variant marked bad by the last round is deployed again)."""
    over = over_good(host, good)
    t0 = time.monotonic()
    res = d.deploy(host, tree, d.DeployOptions(force=True))
    speed, comparison = res.speed or {}, res.comparison or {}
    return {
        "verdict": str(res.verdict), "stage": res.stage, "seconds": round(time.monotonic() - t0, 2),
        "speed_step_s": round(res.step_times.get("speed", 0.0), 2),
        "comparison_s": round(res.step_times.get("baseline", 0.0) + res.step_times.get("comparison", 0.0), 2),
        "speed": speed.get("speed"), "speed_p": speed.get("p"), "speed_verdict": speed.get("verdict"),
        "speed_worst": f"{speed.get('worst')}: {speed.get('worst_speed') or 0:.3f}" if speed else None,
        "comparison": comparison.get("line"), "comparison_outcome": comparison.get("outcome"),
        "baseline": comparison.get("baseline_release"), "good_deploys": over,
    }  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--host", default="tb1", help="the testbed host (default tb1)")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "bench" / "testbed-speed.json")
    ap.add_argument("--report-only", action="store_true", help="write the table again from --out's JSON")
    ap.add_argument("--only", default="", help="the cases whose name holds this text (e.g. comparison)")
    args = ap.parse_args()
    if args.report_only:
        report(json.loads(args.out.read_text()), args.out.with_suffix(".md"))
        return
    base = StateDir().inventory().host(args.host)
    tmp = Path(tempfile.mkdtemp(prefix="kdtree-speed-"))
    good = variants.copy_tree(ROOT, tmp / "good", "good")
    cases = {
        "pre-restart slow:1.1": (configured(base, speed=True, levels=None), variants.slow(ROOT, tmp / "s11", "s11", 1.1)),
        "pre-restart A/A": (configured(base, speed=True, levels=None), variants.copy_tree(ROOT, tmp / "aa1", "aa1")),
        "comparison slow:1.25": (configured(base, speed=False, levels=[1, 8]),
                                 variants.slow(ROOT, tmp / "s125", "s125", 1.25)),
        "comparison A/A": (configured(base, speed=False, levels=[1, 8]), good),
    }  # fmt: skip
    cases = {name: case for name, case in cases.items() if args.only in name}
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in cases}
    for k in range(args.repeat):
        for name, (host, tree) in cases.items():
            r = one(host, tree, good)
            runs[name].append(r)
            print(f"[{k + 1}/{args.repeat}] {name}: {r['verdict']} at {r['stage']} in {r['seconds']}s; "
                  f"speed {r['speed']} (p={r['speed_p']}); {r['comparison']}", flush=True)  # fmt: skip
    d.deploy(configured(base, speed=False, levels=None), good, d.DeployOptions(force=True))
    doc = {"host": args.host, "repeat": args.repeat, "cpus": os.cpu_count(), "load": os.getloadavg(), "runs": runs}
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    report(doc, args.out.with_suffix(".md"))


def stage(r: dict[str, Any]) -> str:
    if r["speed_verdict"] == "FAIL":
        return "pre-restart speed"
    return str(r["stage"] or "-")


def report(doc: dict[str, Any], out: Path) -> None:
    runs: dict[str, list[dict[str, Any]]] = doc["runs"]
    rows = [
        "# Both speed checks on a testbed host, whole deploys",
        "",
        f"Made by `scripts/measure_testbed_speed.py` on {doc['host']} ({doc['cpus']} cores), {doc['repeat']} deploys "
        "a case, each over the good release.",
        "",
        "| case | verdicts | failed at | pre-restart speed | comparison | deploy s | speed step s | comparison s |",
        "|---|---|---|---|---|---:|---:|---:|",
    ]
    for name, rs in runs.items():
        verdicts = ", ".join(f"{v} {sum(r['verdict'] == v for r in rs)}" for v in sorted({r["verdict"] for r in rs}))
        stages = ", ".join(sorted({stage(r) for r in rs if r["verdict"] != "PASS"})) or "-"
        speeds = [r["speed"] for r in rs if r["speed"] is not None]
        sp = f"{min(speeds):.3f}-{max(speeds):.3f}x" if speeds else "off"
        outcomes = [str(r["comparison_outcome"]) for r in rs if r["comparison_outcome"]]
        cmp = ", ".join(f"{o} {outcomes.count(o)}" for o in sorted(set(outcomes))) or "off"
        secs = [r["seconds"] for r in rs]
        rows.append(
            f"| {name} | {verdicts} | {stages} | {sp} | {cmp} | {min(secs):.1f}-{max(secs):.1f} | "
            f"{max(r['speed_step_s'] for r in rs):.1f} max | {max(r['comparison_s'] for r in rs):.1f} max |"
        )
    rows += ["", "The comparison lines:", ""]
    rows += [f"- {name}: {r['comparison']}" for name, rs in runs.items() for r in rs if r["comparison"]]
    out.write_text("\n".join(rows) + "\n")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
