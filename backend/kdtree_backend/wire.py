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

CAPTURE_ID_RE = re.compile(r"c\d{8}T\d{6}Z-[0-9a-f]{6}")
"""A capture id (fullmatch): ``c<UTC date>T<time>Z-<6 hex>``, the name of its directory under the state dir."""

# Exit statuses of the replay programs (``python -m kdtree_backend.replay`` and ``...replay_captures``), read by
# opsctl's pre-restart check and capture replay.
REPLAY_EXIT_OK = 0
REPLAY_EXIT_USAGE = 2
REPLAY_EXIT_PARITY_FAILED = 3
