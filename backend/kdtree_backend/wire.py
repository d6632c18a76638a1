"""The contract between opsctl and the backend, in one place: what the backend prints and reads, and what opsctl
looks for and hands over (docs/lines.md, docs/capture.md).

Both sides import these names: the backend to print its lines and read its token, opsctl (which stays torch-free)
to find, judge and hand them out. So this module imports nothing beyond the standard library, and
tests/backend/test_wire_contract.py pins the two sides' views together.
"""

from __future__ import annotations

import re

MARKER = "[kdtree]"
"""Starts every line the backend prints for opsctl (shapes, parity, fallback)."""

PARITY_TOKEN_VAR = "KDTREE_PARITY_TOKEN"
"""The environment variable the serving process reads its parity token from; opsctl writes a fresh one before
each restart and the gate counts only lines that carry it."""

TOKEN_RE = re.compile(r"[A-Za-z0-9_-]{8,128}")
"""A parity token (fullmatch): what opsctl hands out and the backend accepts; anything else is dropped."""

PARITY_VALUE_MAX = 1.7976e308
"""The largest value a parity line carries (``max_abs_diff``, ``mean``, ``rel``): the backend prints a larger finite
value as this (``%.4e`` would round the largest doubles up to ``1.7977e+308``, past the double's range), and
opsctl's parser refuses a larger one. Both sides read it here: one grammar (docs/lines.md)."""

LEFT_OUT = f"{MARKER} <a message journalctl left out>"
"""Never printed by the backend: what opsctl's journal readers hand on in place of a message journalctl did not
print (``"MESSAGE": null``, ``[N blob data]``; both only without ``--all``), followed by ``": "`` and what it printed
instead. The gate's parser reads it as a malformed line that carries every token: a FAIL, never skipped."""

CAPTURE_ID_RE = re.compile(r"c\d{8}T\d{6}Z-[0-9a-f]{6}")
"""A capture id (fullmatch): ``c<UTC date>T<time>Z-<6 hex>``, the name of its directory under the state dir."""

# Exit statuses of the replay programs (``python -m kdtree_backend.replay`` and ``...replay_captures``), read by
# opsctl's pre-restart check and capture replay.
REPLAY_EXIT_OK = 0
REPLAY_EXIT_USAGE = 2
REPLAY_EXIT_PARITY_FAILED = 3
