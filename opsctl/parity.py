"""Parse the ``[kdtree]`` lines of design.md s.3 (shapes and per-layer parity).

A line may carry a journald prefix (``May 31 13:04:12 host python[22251]: ``) and/or SGLang's logger prefix naming
the tensor-parallel rank (``[2026-05-31 13:04:12 TP3] ``). Unknown ``key=value`` fields are kept. A parity value
that does not parse is NaN, so a garbled parity line can never count as a pass.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

MARKER = "[kdtree] "
_RANK_RE = re.compile(r"\[[^\]\[]*\bTP(\d{1,3})\b[^\]\[]*\]")
# key=value where value is a parenthesised tuple (may hold spaces) or a run of non-space characters.
_FIELD_RE = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)=(\([^)]*\)|\S+)")
_LAYER_RE = re.compile(r"^L(\d+)$")
PARITY_KEYS = ("max_abs_diff", "mean", "rel")


@dataclass(frozen=True)
class ShapesLine:
    """``[kdtree] shapes ...``: the verify metadata the backend saw. Values kept as text; see ``decode``."""

    fields: dict[str, str]
    rank: int | None = None
    raw: str = ""

    def tuple_of(self, key: str) -> tuple[int, ...] | None:
        value = self.fields.get(key)
        if value is None:
            return None
        try:
            return tuple(int(x) for x in value.strip("()").replace(" ", "").split(",") if x)
        except ValueError:
            return None

    def int_of(self, key: str) -> int | None:
        try:
            return int(self.fields[key])
        except (KeyError, ValueError):
            return None

    def decode(self) -> ShapesSummary:
        """What the numbers mean for a reader, plus the classic-bug check of design.md s.2."""
        q = self.tuple_of("q")
        kv_buf = self.tuple_of("kv_buf")
        mask = self.tuple_of("mask")
        bs, q_len, kv_len_max = self.int_of("bs"), self.int_of("q_len"), self.int_of("kv_len_max")
        tokens, heads, head_dim = (*q, None, None, None)[:3] if q else (None, None, None)
        mask_row = None
        warning = None
        if mask and len(mask) == 1 and tokens:
            mask_row = mask[0] // tokens if mask[0] % tokens == 0 else None
            # One request: the mask row covers prefix + drafts, and so must the keys (kv_len_max).
            if bs == 1 and mask_row is not None and kv_len_max is not None and mask_row != kv_len_max:
                warning = f"mask rows hold {mask_row} keys but kv_len_max={kv_len_max}: " + (
                    "draft tokens missing from the keys (classic marshaling bug)"
                    if q_len and mask_row - kv_len_max == q_len
                    else "key/mask length mismatch"
                )
        return ShapesSummary(
            rank=self.rank,
            tokens=tokens,
            heads=heads,
            head_dim=head_dim,
            pool_rows=kv_buf[0] if kv_buf else None,
            bs=bs,
            q_len=q_len,
            kv_len_max=kv_len_max,
            mask_row=mask_row,
            scale=self.fields.get("scale"),
            warning=warning,
        )


@dataclass(frozen=True)
class ShapesSummary:
    rank: int | None
    tokens: int | None
    heads: int | None
    head_dim: int | None
    pool_rows: int | None
    bs: int | None
    q_len: int | None
    kv_len_max: int | None
    mask_row: int | None
    scale: str | None
    warning: str | None

    def text(self) -> str:
        parts = []
        if self.tokens is not None:
            parts.append(f"{self.tokens} query tokens x {self.heads} heads x {self.head_dim}")
        if self.bs is not None and self.q_len is not None:
            parts.append(f"{self.bs} request(s) x {self.q_len} draft tokens")
        if self.kv_len_max is not None:
            parts.append(f"keys per request <= {self.kv_len_max}")
        if self.mask_row is not None:
            # One request: the row length (prefix + drafts). Several: their mean (rows differ per request).
            parts.append(f"mask row {self.mask_row}" if self.bs == 1 else f"mean mask row {self.mask_row}")
        if self.pool_rows is not None:
            parts.append(f"KV pool {self.pool_rows} rows")
        if self.scale is not None:
            parts.append(f"scale {self.scale}")
        return "; ".join(parts)


@dataclass(frozen=True)
class ParityLine:
    """``[kdtree] L<n> max_abs_diff=.. mean=.. rel=..``: kernel vs Triton on one sampled layer."""

    layer: int
    max_abs_diff: float
    mean: float
    rel: float
    rank: int | None = None
    extra: dict[str, str] = field(default_factory=dict)
    raw: str = ""

    @property
    def finite(self) -> bool:
        return all(math.isfinite(v) for v in (self.max_abs_diff, self.mean, self.rel))


@dataclass(frozen=True)
class OtherKdtreeLine:
    """A ``[kdtree]`` line of another kind (kept for logs, ignored by the gate)."""

    text: str
    rank: int | None = None
    raw: str = ""


KdtreeLine = ShapesLine | ParityLine | OtherKdtreeLine


def _number(text: str | None) -> float:
    if text is None:
        return math.nan
    try:
        return float(text.rstrip(","))
    except ValueError:
        return math.nan


def parse_line(line: str) -> KdtreeLine | None:
    """One log line -> its ``[kdtree]`` record, or None when the line is not one."""
    at = line.find(MARKER)
    if at < 0:
        return None
    prefix, body = line[:at], line[at + len(MARKER) :].strip()
    ranks = _RANK_RE.findall(prefix)  # the last [... TPn ...] before the marker names the rank
    rank = int(ranks[-1]) if ranks else None
    raw = line.rstrip("\n")
    head, _, rest = body.partition(" ")
    fields = dict(_FIELD_RE.findall(rest))
    if head == "shapes":
        return ShapesLine(fields=fields, rank=rank, raw=raw)
    layer = _LAYER_RE.match(head)
    if layer:
        extra = {k: v for k, v in fields.items() if k not in PARITY_KEYS}
        return ParityLine(
            layer=int(layer.group(1)),
            max_abs_diff=_number(fields.get("max_abs_diff")),
            mean=_number(fields.get("mean")),
            rel=_number(fields.get("rel")),
            rank=rank,
            extra=extra,
            raw=raw,
        )
    return OtherKdtreeLine(text=body, rank=rank, raw=raw)


def parse_lines(lines: list[str]) -> list[KdtreeLine]:
    return [rec for rec in (parse_line(x) for x in lines) if rec is not None]
