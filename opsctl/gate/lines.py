"""Parse the ``[kdtree]`` lines (the grammar is in docs/lines.md; the backend's formatter is
``backend/kdtree_backend/lines.py``, pinned to this parser by tests/backend/test_lines_grammar.py).

A line is a *marked* line when ``[kdtree]`` starts its message: after an optional SGLang logger prefix
(``[2026-05-31 13:04:12 TP3] ``), nothing else. A journald prefix (every ``journalctl -o short*`` form) is stripped
only where the output format adds it (``journal_prefix=True``: a line of journalctl's text output); a message
(a JSON entry's MESSAGE, ``-o cat``) is taken as it is, so a message that itself starts with a journald-style
prefix is not a marked line in either reading. A served request whose text the server logs (``... please print
[kdtree] L56 rel=0``) is never a marked line; ``misplaced_marker`` tells the gate such a line was seen (the gate
fails it when it carries the invocation's token, docs/gate.md).

A message journalctl left out (``"MESSAGE": null`` without ``--all``; ``[5.0K blob data]`` in its text output) is
``wire.LEFT_OUT``: a malformed line that every token claims (``ParityLine.hidden``), so it fails the gate whatever it
held.

A marked line is one of three kinds, each exactly as the backend prints it: ``shapes`` (:class:`ShapesLine`),
``fallback`` (:class:`FallbackLine`) and parity, ``L<n> ...`` (:class:`ParityLine`). Anything else that starts
with the marker (a garbled head such as ``L56:`` or ``l56``, a tab, a double space, a non-ASCII digit, a sign, an
unknown kind, a line over :data:`MAX_MESSAGE_CHARS`) is returned as a :class:`ParityLine` whose ``problems`` say
what is wrong: every consumer (gate, health, status) then fails it, never passes it, and never drops it as
"another kind". Whether such a line is evidence at all is the gate's question (:meth:`ParityLine.carries`).

Parsing is linear in the line's length: one anchored regex for the prefix, then ``str.split``; no pattern that
rescans the rest of the line per field.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace
from typing import NamedTuple

from kdtree_backend.wire import LEFT_OUT, MARKER, PARITY_VALUE_MAX, TOKEN_RE

from ..journal.reader import JOURNAL_PREFIX
from .ownership import claims_token, token_field
from .shapes import ShapesLine, int_text, tuple_text

# The longest marked message accepted (the marker and everything after it). The backend's lines are under 400
# characters; journald cuts stdout lines at LineMax (48K by default) into several entries, so a longer marked
# message is not one the backend printed. A longer one is malformed (a FAIL when it carries the token).
MAX_MESSAGE_CHARS = 4096
UNKNOWN_LAYER = -1  # the layer of a marked line whose head is not ``L<n>``

# SGLang's logger: "[2026-05-31 13:04:12 TP3] ", "[2026-05-31 13:04:12 DP0 TP7 EP7] ".
_SGLANG_PREFIX = (
    r"\[[0-9]{4}-[0-9]{2}-[0-9]{2} [0-9]{2}:[0-9]{2}:[0-9]{2}(?:[.,][0-9]+)?(?P<parts>(?: [A-Z]{2,4}[0-9]{1,4})*)\] "
)
_MARKER_RE = re.compile(rf"(?:{_SGLANG_PREFIX})?{re.escape(MARKER)}", re.ASCII)
_JOURNAL_MARKER_RE = re.compile(rf"{JOURNAL_PREFIX}(?:{_SGLANG_PREFIX})?{re.escape(MARKER)}", re.ASCII)
_RANK_PART_RE = re.compile(r"\bTP([0-9]{1,4})\b", re.ASCII)

# The values, exactly as the backend prints them: ASCII digits, no sign (but the exponent's), no "_".
_KEY_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*", re.ASCII)
# An exponent of at most 3 digits: ``%.4e`` prints 2 or 3 (e-324 .. e+308); a value must also survive float():
# neither past the double's range (inf) nor a non-zero mantissa that underflows to 0 (``1.0e-400``).
_NUMBER_RE = re.compile(r"[0-9]+(?:\.[0-9]+)?(?:[eE][+-]?[0-9]{1,3})?", re.ASCII)
_LAYER_RE = re.compile(r"L(0|[1-9][0-9]{0,5})", re.ASCII)
_RANK_RE = re.compile(r"0|[1-9][0-9]{0,3}", re.ASCII)
_WORD_RE = re.compile(r"[!-~]+", re.ASCII)  # any other value: printable ASCII, no space

# The common case in one anchored match: a well-formed parity line in the backend's field order. Anything this
# does not take (or whose values it finds not finite, its extras duplicated, its rank at odds with the prefix) goes
# through the full parse, which names the problem; tests/gate/test_parity_properties.py checks the two agree.
_NUM = r"[0-9]+(?:\.[0-9]+)?(?:[eE][+-]?[0-9]{1,3})?"
_FAST_PARITY_BODY = (
    rf"(?:{_SGLANG_PREFIX})?\[kdtree\] L(?P<layer>0|[1-9][0-9]{{0,5}}) "
    rf"max_abs_diff=(?P<a>{_NUM}) mean=(?P<m>{_NUM}) rel=(?P<r>{_NUM}) tp=(?P<tp>0|[1-9][0-9]{{0,3}})"
    r"(?: token=(?P<token>[A-Za-z0-9_-]{8,128}))?(?P<extra>(?: [A-Za-z_][A-Za-z0-9_]*=[!-~]+)*)"
)
_FAST_PARITY_RE = re.compile(_FAST_PARITY_BODY, re.ASCII)
_FAST_JOURNAL_PARITY_RE = re.compile(JOURNAL_PREFIX + _FAST_PARITY_BODY, re.ASCII)
PARITY_KEYS = ("max_abs_diff", "mean", "rel")
RANK_KEY = "tp"
TOKEN_KEY = "token"
SHAPES_INT_KEYS = ("bs", "q_len", "Dl", "Dr", "kv_len_max")
SHAPES_TUPLE_KEYS = ("q", "kv_buf", "mask")
SHAPES_KEYS = (*SHAPES_TUPLE_KEYS[:2], *SHAPES_INT_KEYS, "scale", "mask")
FALLBACK_KEYS = ("reason",)


def _number_ok(text: str) -> bool:
    return _NUMBER_RE.fullmatch(text) is not None


@dataclass(frozen=True)
class ParityLine:
    """``[kdtree] L<n> max_abs_diff=.. mean=.. rel=.. tp=<rank> token=<t>``: kernel vs Triton on one layer.

    Also every marked line that is not a well-formed line of a documented kind (``layer`` is then
    :data:`UNKNOWN_LAYER` unless the head was a good ``L<n>``). ``problems`` lists what is wrong with the line
    itself (empty for a well-formed one); the gate fails a line with any problem. A value that does not parse is
    NaN, so even code that skips ``problems`` cannot pass it."""

    layer: int
    max_abs_diff: float
    mean: float
    rel: float
    rank: int | None = None
    extra: dict[str, str] = field(default_factory=dict)
    raw: str = ""
    token: str | None = None
    problems: tuple[str, ...] = ()
    # journalctl left the message out (LEFT_OUT), or journald split it: whatever it held, it may be ours
    hidden: bool = False

    @property
    def finite(self) -> bool:
        return math.isfinite(self.max_abs_diff) and math.isfinite(self.mean) and math.isfinite(self.rel)

    @property
    def layer_label(self) -> str:
        return "L?" if self.layer == UNKNOWN_LAYER else f"L{self.layer}"

    @property
    def where(self) -> str:
        return self.layer_label + (f" TP{self.rank}" if self.rank is not None else "")

    def carries(self, token: str) -> bool:
        """Whether this line was printed by the invocation that holds ``token`` (:func:`claims_token`), or
        journalctl left the message out or journald split it (it may have been ours)."""
        return self.hidden or claims_token(token, self.token, self.raw)


@dataclass(frozen=True)
class FallbackLine:
    """``[kdtree] fallback reason=<why> path=...``: a call the kernel does not cover (well formed)."""

    fields: dict[str, str]
    rank: int | None = None
    raw: str = ""

    @property
    def text(self) -> str:
        return "fallback " + " ".join(f"{k}={v}" for k, v in self.fields.items())


KdtreeLine = ShapesLine | FallbackLine | ParityLine


def _prefix_rank(parts: str | None) -> int | None:
    ranks = _RANK_PART_RE.findall(parts or "")
    return int(ranks[-1]) if ranks else None


def misplaced_marker(line: str, *, journal_prefix: bool = False) -> bool:
    """The marker appears in the line but does not start its message: text that only looks like a marked line
    (a logged request, say, or two messages glued together). Without the invocation's token it is never counted;
    with it, the gate fails it. ``journal_prefix``: as for :func:`parse_line`."""
    marker_re = _JOURNAL_MARKER_RE if journal_prefix else _MARKER_RE
    return MARKER in line and marker_re.match(line) is None


def _fields(words: list[str], problems: list[str]) -> dict[str, str]:
    """``key=value`` words -> fields (the first value of a duplicated key; the duplicate is a problem). A value
    that opens a tuple runs to the word that closes it (``q=(9, 8, 576)``)."""
    out: dict[str, str] = {}
    i, n = 0, len(words)
    while i < n:
        word = words[i]
        i += 1
        key, eq, value = word.partition("=")
        if not eq or _KEY_RE.fullmatch(key) is None:
            problems.append(f"unexpected text {word[:40]!r}")
            continue
        if value.startswith("(") and not value.endswith(")"):
            parts = [value]
            while i < n and not words[i - 1].endswith(")"):
                parts.append(words[i])
                i += 1
            value = " ".join(parts)
        if key in out:
            problems.append(f"duplicated {key}")
            continue
        out[key] = value
    return out


def _value_problem(key: str, text: str | None) -> str | None:
    if text is None:
        return f"missing {key}"
    if not _number_ok(text):
        return f"garbled {key}={text[:40]}"
    value = float(text)
    if not math.isfinite(value):
        return f"{key}={text[:40]} is not finite"
    if value > PARITY_VALUE_MAX:
        return f"{key}={text[:40]} is above {PARITY_VALUE_MAX:.4e}, the largest value a line carries"
    if value == 0.0 and _underflows(text):
        return f"{key}={text[:40]} is below the smallest double (reads as 0)"
    return None


def _underflows(text: str) -> bool:
    """A number whose float() is 0 although its mantissa is not: an exponent ``%.4e`` never prints."""
    mantissa = text.partition("e")[0].partition("E")[0]
    return mantissa.strip("0.") != ""


def malformed_line(raw: str, problem: str, *, anyones: bool = False) -> ParityLine:
    """A marked text that could not be read as a line at all (a cut JSON entry, say): a malformed line.
    ``anyones``: it claims every token, as a message journalctl left out does (a piece of a message journald split:
    the piece with the token may be another entry)."""
    line = _malformed(raw, None, [problem])
    return replace(line, hidden=True) if anyones else line


def _left_out_line(raw: str) -> ParityLine:
    nan = math.nan
    problem = f"journalctl left the message out ({raw[len(LEFT_OUT) + 2 :][:80]}): read the journal with --all (-a)"
    return ParityLine(UNKNOWN_LAYER, nan, nan, nan, raw=raw, problems=(problem,), hidden=True)


def _malformed(raw: str, rank: int | None, problems: list[str], token: str | None = None) -> ParityLine:
    if token is None:
        token = token_field(raw)
    nan = math.nan
    return ParityLine(UNKNOWN_LAYER, nan, nan, nan, rank=rank, raw=raw, token=token, problems=tuple(problems))


def parse_line(line: str, *, journal_prefix: bool = False) -> KdtreeLine | None:
    """One journal message -> its ``[kdtree]`` record; None when the marker does not start the message. With
    ``journal_prefix``, ``line`` is a line of journalctl's text output (``-o short*``): one journald prefix, which
    the format adds, comes first and is not part of the message. Never raises; a malformed marked line is a
    ParityLine with problems."""
    raw = line[:-1] if line.endswith("\n") else line
    if MARKER not in raw:
        return None
    return _fast_parity(raw, journal_prefix) or _parse_full(raw, journal_prefix)


def _parse_full(raw: str, journal_prefix: bool = False) -> KdtreeLine | None:
    """The whole grammar, naming every problem (``parse_line`` without its fast path)."""
    if raw.startswith(LEFT_OUT):
        return _left_out_line(raw)
    m = (_JOURNAL_MARKER_RE if journal_prefix else _MARKER_RE).match(raw)
    if m is None:
        return None
    prefix_rank = _prefix_rank(m.group("parts"))
    start = m.end() - len(MARKER)
    if len(raw) - start > MAX_MESSAGE_CHARS:
        return _malformed(raw, prefix_rank, [f"longer than {MAX_MESSAGE_CHARS} characters"])
    problems: list[str] = []
    words = _words(raw[m.end() :], problems)
    if not words:
        return _malformed(raw, prefix_rank, [*problems, "nothing after the marker"])
    head, rest = words[0], words[1:]
    fields = _fields(rest, problems)
    if head == "shapes":
        return _shapes(raw, prefix_rank, fields, problems)
    if head == "fallback":
        return _fallback(raw, prefix_rank, fields, problems)
    layer = _LAYER_RE.fullmatch(head)
    if layer is None:
        problems.insert(0, f"not a {MARKER} line of a known kind (head {head[:40]!r})")
        token = fields.get(TOKEN_KEY)
        return _malformed(raw, prefix_rank, problems, token if token and TOKEN_RE.fullmatch(token) else None)
    return _parity(raw, prefix_rank, int(layer.group(1)), fields, problems)


def _words(body: str, problems: list[str]) -> list[str]:
    """What follows the marker, as words; what is wrong with its characters or spacing goes to ``problems``."""
    if not (body.isascii() and body.isprintable()):
        bad = next(c for c in body if not (c.isascii() and c.isprintable()))
        problems.append(f"character {bad!r} (only printable ASCII and single spaces)")
    if not body.startswith(" "):
        problems.append("no space after the marker")
    words = body[1:].split(" ") if body.startswith(" ") else body.split(" ")
    if "" in words:
        problems.append("not single spaces between the fields")
        words = [w for w in words if w]
    return words


_KNOWN_PARITY_KEYS = frozenset((*PARITY_KEYS, RANK_KEY, TOKEN_KEY))
_EXTRA_KEY_RE = re.compile(r" ([A-Za-z_][A-Za-z0-9_]*)=", re.ASCII)


class ParityFields(NamedTuple):
    """A well-formed parity line's values (:func:`fast_fields`), without a :class:`ParityLine`."""

    layer: str
    max_abs_diff: float
    mean: float
    rel: float
    rank: int
    token: str | None
    extra: str  # the extra ``key=value`` words, as one text (each with its leading space)


# ParityFields(...) without type.__call__ finding the NamedTuple's __new__ each time (a third of the cost of making
# one, Python 3.11): made for most lines of a long journal.
_new_fields = ParityFields.__new__


def fast_fields(raw: str, journal_prefix: bool = False) -> ParityFields | None:
    """A well-formed parity line in the backend's field order -> its values, or None (then the full parse
    decides). What :func:`parse_line` makes a well-formed ParityLine of,
    without making it: the offline check reads most lines of a long journal only for their verdict."""
    m = (_FAST_JOURNAL_PARITY_RE if journal_prefix else _FAST_PARITY_RE).fullmatch(raw)
    if m is None or (
        len(raw) > MAX_MESSAGE_CHARS and len(raw) - m.start("layer") + len(MARKER) + 2 > MAX_MESSAGE_CHARS
    ):
        return None
    parts, layer, a_text, m_text, r_text, tp, token, text = m.groups()
    a, mean, rel = float(a_text), float(m_text), float(r_text)
    if a > PARITY_VALUE_MAX or mean > PARITY_VALUE_MAX or rel > PARITY_VALUE_MAX:  # the full parse names it
        return None
    if (a == 0.0 or mean == 0.0 or rel == 0.0) and any(  # underflow to 0: the full parse names it
        v == 0.0 and _underflows(t) for v, t in ((a, a_text), (mean, m_text), (rel, r_text))
    ):
        return None
    rank = int(tp)
    if parts and _prefix_rank(parts) not in (None, rank):
        return None
    if text:
        keys = _EXTRA_KEY_RE.findall(text)  # one per extra word: each starts with " key=", a value has no space
        if len(set(keys)) != len(keys) or not _KNOWN_PARITY_KEYS.isdisjoint(keys):
            return None  # a duplicated key, or a known one again: the full parse names it
    return _new_fields(ParityFields, layer, a, mean, rel, rank, token, text)


def _fast_parity(raw: str, journal_prefix: bool = False) -> ParityLine | None:
    """A well-formed parity line in the backend's field order, or None (then the full parse decides)."""
    fields = fast_fields(raw, journal_prefix)
    if fields is None:
        return None
    layer, a, mean, rel, rank, token, text = fields
    extra = dict(word.split("=", 1) for word in text[1:].split(" ")) if text else {}
    # The frozen dataclass's __init__ sets each field through object.__setattr__ (2-3 us a line, a third of a
    # line's whole cost in a long journal); the fields are the same, set at once.
    line = object.__new__(ParityLine)
    line.__dict__.update(
        {
            "layer": int(layer),
            "max_abs_diff": a,
            "mean": mean,
            "rel": rel,
            "rank": rank,
            "extra": extra,
            "raw": raw,
            "token": token,
            "problems": (),
            "hidden": False,
        }
    )
    return line


def _parity(raw: str, prefix_rank: int | None, layer: int, fields: dict[str, str], problems: list[str]) -> ParityLine:
    values = []
    for key in PARITY_KEYS:
        text = fields.get(key)
        problem = _value_problem(key, text)
        if problem:
            problems.append(problem)
            values.append(math.nan)
        else:
            values.append(float(text))  # type: ignore[arg-type]
    if "duplicated rel" in problems:
        values[2] = math.nan  # never read either of two rel values as the verdict
    rank_text = fields.get(RANK_KEY)
    rank: int | None = None
    if rank_text is None:
        problems.append(f"missing {RANK_KEY}")
    elif _RANK_RE.fullmatch(rank_text) is None:
        problems.append(f"garbled {RANK_KEY}={rank_text[:40]}")
    else:
        rank = int(rank_text)
        if prefix_rank is not None and prefix_rank != rank:
            problems.append(f"{RANK_KEY}={rank} but the logger prefix says TP{prefix_rank}")
    token = fields.get(TOKEN_KEY)
    if token is not None and TOKEN_RE.fullmatch(token) is None:
        problems.append(f"garbled {TOKEN_KEY}")
    extra = {k: v for k, v in fields.items() if k not in (*PARITY_KEYS, RANK_KEY, TOKEN_KEY)}
    for k, v in extra.items():
        if _WORD_RE.fullmatch(v) is None:
            problems.append(f"garbled {k}={v[:40]}")
    return ParityLine(
        layer=layer,
        max_abs_diff=values[0],
        mean=values[1],
        rel=values[2],
        rank=rank if rank is not None else prefix_rank,
        extra=extra,
        raw=raw,
        token=token,
        problems=tuple(problems),
    )


def _shapes(raw: str, rank: int | None, fields: dict[str, str], problems: list[str]) -> KdtreeLine:
    for key in SHAPES_KEYS:
        value = fields.get(key)
        if value is None:
            problems.append(f"missing {key}")
        elif key in SHAPES_TUPLE_KEYS:
            if tuple_text(value) is None:
                problems.append(f"garbled {key}={value[:40]}")
        elif key == "scale":
            if not _number_ok(value):
                problems.append(f"garbled {key}={value[:40]}")
        elif int_text(value) is None:
            problems.append(f"garbled {key}={value[:40]}")
    _check_extra(fields, SHAPES_KEYS, problems)
    if problems:
        return _malformed(raw, rank, ["malformed shapes line", *problems])
    return ShapesLine(fields=fields, rank=rank, raw=raw)


def _fallback(raw: str, rank: int | None, fields: dict[str, str], problems: list[str]) -> KdtreeLine:
    if "reason" not in fields:
        problems.append("missing reason")
    _check_extra(fields, (), problems)
    if problems:
        return _malformed(raw, rank, ["malformed fallback line", *problems])
    return FallbackLine(fields=fields, rank=rank, raw=raw)


def _check_extra(fields: dict[str, str], known: tuple[str, ...], problems: list[str]) -> None:
    for k, v in fields.items():
        if k in known:
            continue
        if _WORD_RE.fullmatch(v) is None and tuple_text(v) is None:
            problems.append(f"garbled {k}={v[:40]}")


def parse_lines(lines: list[str], *, journal_prefix: bool = False) -> list[KdtreeLine]:
    return [rec for rec in (parse_line(x, journal_prefix=journal_prefix) for x in lines) if rec is not None]
