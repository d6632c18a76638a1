"""Condense pip's output for scripts/setup.sh: what a newcomer needs to see, nothing that reads like a failure
when nothing failed.

    pip install ... >LOG 2>&1; python3 scripts/pip_summary.py LOG [--expected PKG ...]

pip reports every unmet requirement of a package installed with --no-deps as "ERROR: pip's dependency resolver
... sglang 0.5.23 requires torch==2.14.1, but you have torch 2.13.0+cpu which is incompatible" although the
install succeeded. For the packages named with --expected (installed without their dependencies on purpose)
those lines become one explained line; a conflict of any other package is printed as it is. Lines about this
machine's pip configuration (package folders that do not exist) and setup.sh's own "$ pip install ..." headings
in the log are dropped. Exit 0.
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

RESOLVER_HEADER = "ERROR: pip's dependency resolver does not currently take into account"
_REQUIRES = re.compile(
    r"^(?P<pkg>[A-Za-z0-9_.\-]+) (?P<ver>\S+) requires (?P<req>.+?)(?:, which is not installed|, but you have (?P<have>.+?) which is incompatible)\.$"
)
_NOISE = ("is ignored: it is neither a file nor a directory",)


@dataclass
class Summary:
    lines: list[str] = field(default_factory=list)  # printed as they are
    expected: dict[str, list[str]] = field(default_factory=dict)  # "sglang 0.5.23" -> its unmet requirements
    mismatches: dict[str, list[str]] = field(default_factory=dict)  # "sglang 0.5.23" -> "torch==2.14.1 (have ...)"


def summarise(text: str, expected: set[str]) -> Summary:
    """pip output -> what to show. Pure."""
    out = Summary()
    for raw in text.splitlines():
        line = raw.rstrip()
        if not line.strip() or any(n in line for n in _NOISE) or line.startswith((RESOLVER_HEADER, "$ ")):
            continue
        m = _REQUIRES.match(line.strip())
        if m and m.group("pkg").lower() in expected:
            key = f"{m.group('pkg')} {m.group('ver')}"
            out.expected.setdefault(key, []).append(m.group("req"))
            if m.group("have"):
                out.mismatches.setdefault(key, []).append(f"{m.group('req')} (this machine has {m.group('have')})")
            continue
        out.lines.append(line)
    return out


def render(s: Summary) -> list[str]:
    lines = list(s.lines)
    for key, reqs in s.expected.items():
        # pip words each requirement left out by --no-deps as an ERROR; here it is the intended state, so the line
        # says what was installed and why, without a count of "unmet" packages that reads like a failure.
        pins = "; ".join(s.mismatches.get(key, []))
        lines.append(
            f"{key}: its Python code only, as intended (the backend's CPU tests import nothing else; the "
            f"{len(reqs)} GPU-serving packages it lists stay out of this venv"
            + (f"; for its pin {pins} the CPU torch stands in" if pins else "")
            + ")"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("log", type=Path)
    ap.add_argument("--expected", action="append", default=[], help="package installed with --no-deps on purpose")
    args = ap.parse_args(argv)
    for line in render(summarise(args.log.read_text(errors="replace"), {p.lower() for p in args.expected})):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
