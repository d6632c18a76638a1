"""Release trees that misbehave on purpose, for the rehearsal and the tests: a copy of a working tree's bundle
directories with one deliberate change, so that what the gate catches is real code running on a testbed host.

    opsctl testbed variant seed-bug DEST [--src TREE]

``seed-bug`` is the marshaling bug this project exists to catch (docs/sglang-verify.md): the draft rows are left
out of the keys, made the way ``backend/kdtree_backend/marshal.py``'s docstring says (its tagged line becomes
``pass``). The pre-restart check runs the same marshal code and catches it before the restart; deploy the tree with
``--skip-prerestart-parity`` to watch the gate catch it on served traffic instead, and roll back.

``slow`` (every verify step 1.5x as long) and ``common-mode`` (a metadata bug the kernel path and its reference
share) set the tree's ``standin.fault`` (docs/testbed.md): both pass parity, before and after the restart, and only
the comparison with the release they replace (docs/gate.md) catches them.

``padded-line`` and ``glued-line`` are the lines journald hid from the gate (issue 36): TP rank 1's first L30 parity
line fails (rel 0.9, with the invocation's token), and goes out padded to :data:`PADDED_CHARS` characters
(``journalctl -o json`` without ``--all`` prints it as ``null``), or glued behind a served-request log line (the
marker no longer starts the message). Every other line is the release's own, so only these lines can fail it; the
pre-restart replay prints them too, so deploy with ``--skip-prerestart-parity`` to watch the gate.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

from ..release import BUNDLE_DIRS

MARSHAL = Path("backend/kdtree_backend/marshal.py")
LINES = Path("backend/kdtree_backend/lines.py")
PADDED_CHARS = 5116  # the reproducer: over journalctl's 4096-byte JSON threshold and the grammar's limit
GLUED_HEAD = "kdtree-standin: served rid=glued prompt_tokens=4 completion_tokens=8 e2e_latency=0.540s"
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


SLOW_FACTOR = 1.5  # the rehearsal's slow release (deploy/rehearse.sh --slow)


def with_standin_fault(tree: Path, fault: str) -> Path:
    """``tree`` whose stand-in server injects ``fault`` (``standin.fault`` of its deploy/kdtree.json)."""
    config = tree / "deploy" / "kdtree.json"
    try:
        data = json.loads(config.read_text())
    except (OSError, ValueError) as exc:
        raise VariantError(f"{config}: cannot read the release's configuration: {exc}") from None
    data.setdefault("standin", {})["fault"] = fault
    config.write_text(json.dumps(data, indent=2) + "\n")
    return tree


def slow(src: Path, dest: Path, tag: str = "slow", factor: float = SLOW_FACTOR) -> Path:
    """A copy of ``src`` whose every verify step takes ``factor`` times as long on the testbed: parity passes, the
    comparison's decode speed does not."""
    return with_standin_fault(copy_tree(src, dest, tag), f"slow:{factor:g}")


SLOW_BATCH_FACTOR = 1.5  # the variant slower only at 8 concurrent requests (issue 48)


def slow_batch(src: Path, dest: Path, tag: str = "slow-batch", factor: float = SLOW_BATCH_FACTOR) -> Path:
    """A copy of ``src`` whose stand-in server takes ``factor`` times as long per verify step while 2 or more
    requests are decoded, and full speed for one alone: slower only under concurrent requests."""
    return with_standin_fault(copy_tree(src, dest, tag), f"slow-batch:{factor:g}")


def common_mode(src: Path, dest: Path, tag: str = "common-mode") -> Path:
    """A copy of ``src`` with a wrong ``sm_scale`` in the verify metadata, read by the kernel path and the reference
    alike: parity passes, the answers change."""
    return with_standin_fault(copy_tree(src, dest, tag), "common-mode")


# Appended to the copy's lines.py: format_parity wrapped, so the replay service and the stand-in, which import it
# from there, print rank 1's first L30 line as the variant says ({shape}: "padded" or "glued").
_LINE_VARIANT = """

# kdtree:variant {shape} (opsctl testbed variant {shape}-line; never in a real release)
_variant_format_parity = format_parity
_variant_done: set[str] = set()


def format_parity(layer, max_abs_diff, mean, rel, identity, **extra):  # type: ignore[no-redef]
    if identity.tp != 1 or layer != 30 or "{shape}" in _variant_done:
        return _variant_format_parity(layer, max_abs_diff, mean, rel, identity, **extra)
    _variant_done.add("{shape}")
    line = _variant_format_parity(layer, max_abs_diff, mean, 0.9, identity, **extra)
    if "{shape}" == "padded":
        return line + " pad=" + "x" * max(1, {padded} - len(line) - 5)
    return {glued!r} + line
"""


def _line_variant(src: Path, dest: Path, tag: str, shape: str) -> Path:
    tree = copy_tree(src, dest, tag)
    lines = tree / LINES
    text = lines.read_text()
    if "def format_parity(" not in text:
        raise VariantError(f"{LINES}: no format_parity to wrap")
    lines.write_text(text + _LINE_VARIANT.format(shape=shape, padded=PADDED_CHARS, glued=GLUED_HEAD))
    return tree


def padded_line(src: Path, dest: Path, tag: str = "padded-line") -> Path:
    """A copy of ``src`` whose rank 1 prints its first L30 line failing and padded to PADDED_CHARS characters."""
    return _line_variant(src, dest, tag, "padded")


def glued_line(src: Path, dest: Path, tag: str = "glued-line") -> Path:
    """A copy of ``src`` whose rank 1 prints its first L30 line failing, glued behind a served-request line."""
    return _line_variant(src, dest, tag, "glued")


VARIANTS = {
    "seed-bug": seed_bug,
    "slow": slow,
    "slow-batch": slow_batch,
    "common-mode": common_mode,
    "padded-line": padded_line,
    "glued-line": glued_line,
}
