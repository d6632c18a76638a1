"""Print a command of the README, as written there: the fenced block that follows ``<!-- command: NAME -->``.

    python3 scripts/readme_command.py main-job      # -> bash scripts/setup.sh && deploy/rehearse.sh

.ci/run runs the main job this way, so the README and the scripts cannot drift apart. Exit 2 when the README
has no such block.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"
_BLOCK = re.compile(r"<!-- command: (?P<name>[\w-]+) -->\s*\n```[a-z]*\n(?P<body>.*?)\n```", re.S)


def commands(text: str) -> dict[str, str]:
    """Marked command blocks of a README: name -> the block's text. Pure."""
    return {m.group("name"): m.group("body").strip() for m in _BLOCK.finditer(text)}


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: readme_command.py NAME", file=sys.stderr)
        return 2
    found = commands(README.read_text())
    if argv[0] not in found:
        print(
            f"error: {README} has no block marked <!-- command: {argv[0]} --> (has: {', '.join(found) or 'none'})",
            file=sys.stderr,
        )
        return 2
    print(found[argv[0]])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
