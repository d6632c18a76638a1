"""The capture request and the on-disk layout of a capture: what opsctl writes, what the service stores and what
the replay reads (docs/capture.md).

Layout on a host (``<root>`` is the release root; every directory 0700, every file 0600):

    <root>/state/capture/
      request.json                  what opsctl asks for (CaptureRequest): id, layers, steps, max bytes per TP rank,
                                    expiry (host clock). Read by the service at most once per capture.POLL_S.
      <id>/                         one capture (one request)
        tp<r>-L<layer>-s<step>/     one call: one layer of one verify step on TP rank r
          inputs.safetensors        the kernel's contract: q, kv_rows (the rows the call reads, gathered),
                                    key_indptr + keys (the running release's key lists, remapped to kv_rows),
                                    qo_indptr, draft_mask (packed)
          sglang.safetensors        SGLang's metadata as received, indices remapped to kv_rows: kv_indptr,
                                    kv_indices, out_cache_loc, custom_mask, mask_indptr, seq_lens
          output.safetensors        out: what the running release returned
          manifest.json             written last (its presence means the call is complete): format, capture id,
                                    release, tp, layer, step, sm_scale, k/v scales, q_len, shapes, dtypes and the
                                    sha256 and size of each file
        tp<r>.done.json             rank r has finished this capture: calls, bytes, steps, why it stopped
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .wire import CAPTURE_ID_RE

FORMAT = "kdtree-capture/1"
CAPTURE_SUBDIR = "capture"
REQUEST_FILE = "request.json"
STATE_ENV = "KDTREE_STATE_DIR"  # <root>/state; default: derived from where this release lives
RELEASE_ENV = "KDTREE_RELEASE_ID"
MAX_STEPS = 64
MAX_LAYERS = 512
CALL_RE = re.compile(r"tp(\d{1,4})-L(\d{1,6})-s(\d{1,9})")
FILES = ("inputs", "sglang", "output")


class CaptureError(ValueError):
    """A malformed request or capture; the message names the field or file."""


def log(message: str) -> None:
    """Capture's own stderr lines (journald), apart from the ``[kdtree]`` lines on stdout."""
    print(f"kdtree-capture: {message}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------- the request


@dataclass(frozen=True)
class CaptureRequest:
    id: str
    layers: tuple[int, ...]
    steps: int
    max_bytes: int  # per TP rank
    expires_at: float  # epoch seconds, host clock
    requested_at: float = 0.0
    requested_by: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "id": self.id,
            "layers": list(self.layers),
            "steps": self.steps,
            "max_bytes": self.max_bytes,
            "expires_at": self.expires_at,
            "requested_at": self.requested_at,
            "requested_by": self.requested_by,
        }

    def expired(self, now: float) -> bool:
        return now >= self.expires_at


def _int_field(data: Mapping[str, Any], key: str, lo: int, hi: int) -> int:
    value = data.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise CaptureError(f"request.{key} must be an integer in {lo}..{hi}, got {value!r}")
    return value


def parse_request(data: object) -> CaptureRequest:
    """A request from its JSON value; every field checked (a bad one is a :class:`CaptureError` naming it)."""
    if not isinstance(data, Mapping):
        raise CaptureError("request must be a JSON object")
    ident = data.get("id")
    if not isinstance(ident, str) or not CAPTURE_ID_RE.fullmatch(ident):
        raise CaptureError(f"request.id must look like c20260601T120000Z-0a1b2c, got {ident!r}")
    layers_raw = data.get("layers")
    if not isinstance(layers_raw, list) or not 1 <= len(layers_raw) <= MAX_LAYERS:
        raise CaptureError(f"request.layers must be a list of 1..{MAX_LAYERS} layer ids, got {layers_raw!r}")
    if any(isinstance(x, bool) or not isinstance(x, int) or not 0 <= x < 100_000 for x in layers_raw):
        raise CaptureError(f"request.layers must hold layer ids >= 0, got {layers_raw!r}")
    expires = data.get("expires_at")
    if isinstance(expires, bool) or not isinstance(expires, int | float) or expires != expires:
        raise CaptureError(f"request.expires_at must be a number (epoch seconds), got {expires!r}")
    requested_at = data.get("requested_at", 0.0)
    if isinstance(requested_at, bool) or not isinstance(requested_at, int | float):
        raise CaptureError(f"request.requested_at must be a number, got {requested_at!r}")
    by = data.get("requested_by", "")
    if not isinstance(by, str):
        raise CaptureError(f"request.requested_by must be a string, got {by!r}")
    return CaptureRequest(
        id=ident,
        layers=tuple(sorted(set(layers_raw))),
        steps=_int_field(data, "steps", 1, MAX_STEPS),
        max_bytes=_int_field(data, "max_bytes", 1, 1 << 50),
        expires_at=float(expires),
        requested_at=float(requested_at),
        requested_by=by[:200],
    )


def call_name(tp: int, layer: int, step: int) -> str:
    return f"tp{tp}-L{layer}-s{step}"


def done_name(tp: int) -> str:
    return f"tp{tp}.done.json"


# ---------------------------------------------------------------------------------------------- where


def locate(module_file: str | Path = __file__, environ: Mapping[str, str] | None = None) -> tuple[Path | None, str]:
    """(the capture directory, this release's id). ``$KDTREE_STATE_DIR`` wins; else a release installed as
    ``<root>/releases/<id>/backend/kdtree_backend/`` uses ``<root>/state``. Elsewhere (a checkout, a wheel) capture
    is off: (None, ...)."""
    env = os.environ if environ is None else environ
    here = Path(module_file).resolve()
    release_dir = here.parents[2]
    installed = here.parents[3].name == "releases"
    release = env.get(RELEASE_ENV) or (release_dir.name if installed else "unreleased")
    state = env.get(STATE_ENV)
    if state:
        return Path(state) / CAPTURE_SUBDIR, release
    if installed:
        return here.parents[4] / "state" / CAPTURE_SUBDIR, release
    return None, release
