"""Benchmark of the command line's start (docs/bench/startup.md): each command as a whole process, as a user's
shell starts it (the venv's ``opsctl`` script), 5 runs each after one discarded warm-up, the median and the range.
Beside them, in the same run, the floors they cannot go under: the interpreter alone and its imports of Typer and
of pydantic (which Typer 0.29 imports as soon as it builds a command's parameters, and the inventory's models need).

    .venv/bin/python scripts/bench_startup.py          # writes docs/bench/startup.{json,md}
    .venv/bin/python scripts/bench_startup.py --runs 9 --no-write
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGET_S = 0.35  # the bar of the commands that connect nowhere

COMMANDS: dict[str, list[str]] = {
    "opsctl --help": ["--help"],
    "opsctl hosts --json": ["-i", "inventory.yaml", "hosts", "--json"],
    "opsctl parity check --help": ["parity", "check", "--help"],
    "opsctl compare --help": ["compare", "--help"],
    "opsctl bundle --help": ["bundle", "--help"],
}
FLOORS: dict[str, list[str]] = {
    "python -c pass": ["-c", "pass"],
    "python -c 'import typer'": ["-c", "import typer"],
    "python -c 'import typer, pydantic'": ["-c", "import typer, pydantic"],
}


def timed(argv: list[str], runs: int) -> list[float]:
    times = []
    for i in range(runs + 1):
        started = time.perf_counter()
        subprocess.run(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
        if i:  # the first run warms the page cache
            times.append(time.perf_counter() - started)
    return times


def row(name: str, times: list[float], target: float | None) -> dict[str, object]:
    median = statistics.median(times)
    return {
        "command": name,
        "median_s": round(median, 4),
        "min_s": round(min(times), 4),
        "max_s": round(max(times), 4),
        "runs": len(times),
        "within_target": None if target is None else median <= target,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--no-write", action="store_true", help="print only")
    args = ap.parse_args()
    venv = Path(sys.executable).parent
    opsctl = venv / "opsctl"
    rows = [row(n, timed([str(opsctl), *a], args.runs), TARGET_S) for n, a in COMMANDS.items()]
    rows += [row(n, timed([sys.executable, *a], args.runs), None) for n, a in FLOORS.items()]
    doc = {
        "target_s": TARGET_S,
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
        "load_1min": round(os.getloadavg()[0], 2),
        "results": rows,
    }
    lines = [
        "# Start-up of the command line",
        "",
        f"`scripts/bench_startup.py`: whole processes, median of {args.runs} after a warm-up; {doc['machine']}, "
        f"1-minute load {doc['load_1min']} when it ran. Target for commands that connect nowhere: <= {TARGET_S} s.",
        "",
        "| command | median (s) | min-max (s) | within target |",
        "|---|---:|---:|---|",
    ]
    for r in rows:
        ok = {True: "yes", False: "**no**", None: "(floor)"}[r["within_target"]]  # type: ignore[index]
        lines.append(f"| `{r['command']}` | {r['median_s']:.3f} | {r['min_s']:.3f}-{r['max_s']:.3f} | {ok} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if not args.no_write:
        out = ROOT / "docs" / "bench"
        (out / "startup.json").write_text(json.dumps(doc, indent=2) + "\n")
        (out / "startup.md").write_text(text)
    return 0 if all(r["within_target"] is not False for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
