"""Parse the ``[kdtree]`` lines (shapes and per-layer parity; the format is in docs/lines.md).

Only a real parity line counts. A line is a ``[kdtree]`` line when the marker *starts the message*: after an
optional journald prefix (``May 31 13:04:12 host python[22251]: `` or the ISO form of ``-o short-iso``) and an
optional SGLang logger prefix (``[2026-05-31 13:04:12 TP3] ``), nothing else. A served request whose text the
server logs (``... please print [kdtree] L56 rel=0``) therefore never parses as one; ``misplaced_marker`` tells
the gate such a line was seen, so it can say so.

A parity line is checked field by field; whatever is wrong goes into ``ParityLine.problems`` and makes the line
a FAIL in the gate (never a pass): a missing, duplicated, garbled, non-finite or negative ``rel``,
``max_abs_diff`` or ``mean``; a missing or garbled ``tp=<rank>``; a duplicated key of any kind; free text between
the fields; a ``tp=`` that contradicts the logger prefix's ``TPn``. Unknown ``key=value`` fields are kept.
The per-invocation ``token=`` is carried as read; comparing it is the gate's job (it knows the expected one).
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass, field

MARKER = "[kdtree] "
# journalctl -o short / short-precise / short-iso / short-iso-precise: "<time> <host> <ident>[<pid>]: ".
_JOURNAL_PREFIX = (
    r"(?:[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d(?:\.\d+)?"
    r"|\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?)"
    r" \S+ [^\s\[\]:]+(?:\[\d+\])?: "
)
# SGLang's logger: "[2026-05-31 13:04:12 TP3] ", "[2026-05-31 13:04:12 DP0 TP7 EP7] ".
_SGLANG_PREFIX = r"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:[.,]\d+)?(?P<parts>(?: [A-Z]{2,4}\d{1,4})*)\] "
_LINE_RE = re.compile(rf"(?P<journal>{_JOURNAL_PREFIX})?(?:{_SGLANG_PREFIX})?\[kdtree\] (?P<body>.*)", re.DOTALL)
_RANK_PART_RE = re.compile(r"\bTP(\d{1,4})\b")
# key=value where value is a parenthesised tuple (may hold spaces) or a run of non-space characters.
_FIELD_RE = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)=(\([^)]*\)|\S+)")
_LAYER_RE = re.compile(r"L(\d{1,6})")
_RANK_VALUE_RE = re.compile(r"\d{1,4}")
PARITY_KEYS = ("max_abs_diff", "mean", "rel")
RANK_KEY = "tp"
TOKEN_KEY = "token"


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
        """What the numbers mean for a reader, plus the classic-bug check of docs/sglang-verify.md."""
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
    """``[kdtree] L<n> max_abs_diff=.. mean=.. rel=.. tp=<rank> token=<t>``: kernel vs Triton on one layer.

    ``problems`` lists what is wrong with the line itself (empty for a well-formed one); the gate fails a line
    with any problem. A value that does not parse is NaN, so even code that skips ``problems`` cannot pass it."""

    layer: int
    max_abs_diff: float
    mean: float
    rel: float
    rank: int | None = None
    extra: dict[str, str] = field(default_factory=dict)
    raw: str = ""
    token: str | None = None
    problems: tuple[str, ...] = ()

    @property
    def finite(self) -> bool:
        return all(math.isfinite(v) for v in (self.max_abs_diff, self.mean, self.rel))

    @property
    def where(self) -> str:
        return f"L{self.layer}" + (f" TP{self.rank}" if self.rank is not None else "")


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
        return float(text)
    except ValueError:
        return math.nan


def _value_problem(key: str, text: str | None) -> str | None:
    if text is None:
        return f"missing {key}"
    value = _number(text)
    if math.isnan(value) and text.strip().lower() not in ("nan", "+nan", "-nan"):
        return f"garbled {key}={text}"
    if not math.isfinite(value):
        return f"{key}={text} is not finite"
    if value < 0:
        return f"negative {key}={text}"
    return None


def _prefix_rank(parts: str | None) -> int | None:
    ranks = _RANK_PART_RE.findall(parts or "")
    return int(ranks[-1]) if ranks else None


def misplaced_marker(line: str) -> bool:
    """The marker appears in the line but does not start its message: text that only looks like a parity line
    (a logged request, say). Such a line is never counted; the gate reports it."""
    return MARKER.strip() in line and parse_line(line) is None


def parse_line(line: str) -> KdtreeLine | None:
    """One log line -> its ``[kdtree]`` record, or None when the marker does not start the message."""
    raw = line.rstrip("\n")
    m = _LINE_RE.fullmatch(raw)
    if m is None:
        return None
    prefix_rank = _prefix_rank(m.group("parts"))
    body = m.group("body").strip()
    head, _, rest = body.partition(" ")
    pairs = _FIELD_RE.findall(rest)
    fields = dict(pairs)
    if head == "shapes":
        return ShapesLine(fields=fields, rank=prefix_rank, raw=raw)
    layer = _LAYER_RE.fullmatch(head)
    if not layer:
        return OtherKdtreeLine(text=body, rank=prefix_rank, raw=raw)

    problems: list[str] = []
    duplicated = sorted(k for k, n in Counter(k for k, _ in pairs).items() if n > 1)
    problems += [f"duplicated {k}" for k in duplicated]
    leftover = _FIELD_RE.sub("", rest).strip()
    if leftover:
        problems.append(f"unexpected text {leftover[:40]!r}")
    for key in PARITY_KEYS:
        problem = _value_problem(key, fields.get(key))
        if problem:
            problems.append(problem)
    rank_text = fields.get(RANK_KEY)
    rank: int | None = None
    if rank_text is None:
        problems.append(f"missing {RANK_KEY}")
    elif not _RANK_VALUE_RE.fullmatch(rank_text):
        problems.append(f"garbled {RANK_KEY}={rank_text}")
    else:
        rank = int(rank_text)
        if prefix_rank is not None and prefix_rank != rank:
            problems.append(f"{RANK_KEY}={rank} but the logger prefix says TP{prefix_rank}")
    extra = {k: v for k, v in fields.items() if k not in (*PARITY_KEYS, RANK_KEY, TOKEN_KEY)}
    return ParityLine(
        layer=int(layer.group(1)),
        max_abs_diff=_number(fields.get("max_abs_diff")),
        mean=_number(fields.get("mean")),
        rel=_number(fields.get("rel")) if "rel" not in duplicated else math.nan,
        rank=rank if rank is not None else prefix_rank,
        extra=extra,
        raw=raw,
        token=fields.get(TOKEN_KEY),
        problems=tuple(problems),
    )


def parse_lines(lines: list[str]) -> list[KdtreeLine]:
    return [rec for rec in (parse_line(x) for x in lines) if rec is not None]
