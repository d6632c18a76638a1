"""Release trees that misbehave on purpose, for the rehearsal and the tests: a copy of a working tree's bundle
directories with one deliberate change, so that what the gate catches is real code running on a testbed host.

    opsctl testbed variant seed-bug DEST [--src TREE]

``seed-bug`` is the marshaling bug this project exists to catch (docs/sglang-verify.md): the draft rows are left
out of the keys, made the way ``backend/kdtree_backend/marshal.py``'s docstring says (its tagged line becomes
``pass``). The pre-restart check runs the same marshal code and catches it before the restart; deploy the tree with
``--skip-prerestart-parity`` to watch the gate catch it on served traffic instead, and roll back.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from ..release import BUNDLE_DIRS

MARSHAL = Path("backend/kdtree_backend/marshal.py")
DRAFTS_TAG = "# kdtree:drafts-appended"
VARIANT_FILE = Path("deploy/VARIANT")  # a marker that makes the variant's release id new
_IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc", "*.so", "build", "*.egg-info", ".pytest_cache")


class VariantError(ValueError):
    """The source tree cannot be made into the asked variant; the message names the file."""


def copy_tree(src: Path, dest: Path, tag: str = "") -> Path:
    """A copy of ``src``'s bundle directories; ``tag`` is written to deploy/VARIANT so the release id differs."""
    dest.mkdir(parents=True, exist_ok=True)
    for d in BUNDLE_DIRS:
        shutil.copytree(src / d, dest / d, ignore=_IGNORE, dirs_exist_ok=True)
    if tag:
        (dest / VARIANT_FILE).write_text(f"{tag}\n")
    return dest


def without_drafts(marshal_text: str) -> str:
    """marshal.py's text with the seed's bug: every code line tagged ``kdtree:drafts-appended`` becomes ``pass``."""
    out, changed = [], 0
    for line in marshal_text.splitlines(keepends=True):
        if DRAFTS_TAG in line and not line.lstrip().startswith("#"):
            indent = re.match(r"\s*", line).group(0)  # type: ignore[union-attr]
            out.append(f"{indent}pass  # the seed's bug: drafts not appended ({line.strip()})\n")
            changed += 1
        else:
            out.append(line)
    if not changed:
        raise VariantError(f"{MARSHAL}: no code line tagged '{DRAFTS_TAG}'")
    return "".join(out)


def seed_bug(src: Path, dest: Path, tag: str = "seed-bug") -> Path:
    """A copy of ``src`` whose marshaling leaves the drafts out of the keys."""
    tree = copy_tree(src, dest, tag)
    marshal = tree / MARSHAL
    marshal.write_text(without_drafts(marshal.read_text()))
    return tree


VARIANTS = {"seed-bug": seed_bug}
