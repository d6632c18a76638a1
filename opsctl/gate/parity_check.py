"""The offline parity check (``opsctl parity check FILE|-``): journal text in, the gate's verdict out, decided by
the same parser (``opsctl/parity.py``) and the same ``GateState`` and ``judge`` as a deploy's gate.

Pure over data: :class:`JournalReader` turns input lines (bytes, split on ``\\n`` only, as the live gate's
journal messages are) into journal entries; :func:`check_entries` finds the invocations in them and judges them.
Reading the file or stdin is the CLI's job (``opsctl/cli/parity.py``). Memory is bounded: each line is judged as
it comes and only the listed lines (counted ones, up to :data:`MAX_LISTED`, and the first few ignored ones) and
each invocation's figures are kept.

The differences from a live gate are only the ones an offline journal forces: there is no unit to observe and
no clock, so the end of an invocation's text is its deadline (``GateState.conclude``): K passes on every rank ->
PASS; a failing or malformed line -> FAIL; a silent rank or no line -> NODATA; anything else -> INCONCLUSIVE.

Which lines one gate run judges (docs/gate.md "Checking a journal offline"): with ``token`` given, every line,
judged with that token, as the live gate would. Without it, the text is cut into invocations: a new token on a
parity line starts one, and so does a restart boundary (systemd's ``Starting``/``Started``, the launcher's
start line, journalctl's ``-- Boot`` line, a new ``_SYSTEMD_INVOCATION_ID`` in JSON) followed by a parity line
without the previous token. Each invocation is judged with its own token, as its deploy's gate was; the verdict
is the **last** one's.
"""

from __future__ import annotations

import json
import json.scanner
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from enum import StrEnum
from typing import NamedTuple

from ..errors import UsageError
from ..inventory import GateSettings
from ..journal.query import line_break, message_text
from .decision import GateState, Judgement, LineVerdict, Verdict, json_float, judge, line_reason, split_piece_claimed
from .lines import (
    JOURNAL_PREFIX_RE,
    MARKER,
    MIN_TOKEN_PIECE,
    ParityLine,
    fast_fields,
    is_blob_placeholder,
    left_out_message,
    loose_token,
    malformed_line,
    parse_line,
)

MAX_LISTED = 1000  # counted lines listed per invocation (the rest only counted)
MAX_LISTED_IGNORED = 5  # ignored lines listed per invocation
MAX_LISTED_LATE = 5  # failing lines after the decision listed per invocation


class InputFormat(StrEnum):
    TEXT = "text"  # journalctl -o short* / cat, or bare messages; also `opsctl logs` output
    JSON = "json"  # journalctl -o json / json-seq / json-sse, or `opsctl logs --json`


class Entry(NamedTuple):
    """One journal entry as the gate would see it (a tuple: one is made for every marked line)."""

    number: int  # 1-based line number in the input
    message: str  # a text line as printed (prefixes included; see JournalReader.prefixed), or a JSON MESSAGE
    invocation: str = ""  # _SYSTEMD_INVOCATION_ID, when the input has it
    boundary: bool = False  # a restart boundary: the start of a new invocation of the unit
    unreadable: bool = False  # a line of JSON input that is not an entry (judged as text; fail-closed)
    prefixed: bool = False  # a line of journalctl's short* output: its first journald prefix is the format's
    split: str = ""  # JSON: the entry's _LINE_BREAK (journald cut the message; judged as a piece)


# Restart boundaries. systemd[1] starting the unit: "Starting sglang-k26-ddtree.service - ...", "Started ...";
# the service's own first line (backend/kdtree_backend/launch.py); journalctl's "-- Boot <id> --".
_SYSTEMD_TEXT_RE = re.compile(r"\S+(?: \S+){0,4}? systemd\[1\]: (?:Starting|Started) \S", re.ASCII)
_BOOT_RE = re.compile(r"-- (?:Boot [0-9a-f]+|Reboot) --")
LAUNCH_START = "kdtree-launch: preflight ok"
_UNSUPPORTED = {
    "export": "journalctl -o export is not supported: use -o json or -o short-iso",
    "verbose": "journalctl -o verbose is not supported: use -o json or -o short-iso",
    "json-pretty": "journalctl -o json-pretty is not supported: use -o json (one entry per line)",
}
_VERBOSE_RE = re.compile(rb"[A-Z][a-z]{2} [0-9-]+ [0-9:.]+ \S+ \[s=[0-9a-f]+;i=", re.ASCII)


def _text_boundary(line: str) -> bool:
    if LAUNCH_START in line:
        return True
    if "systemd[1]: Start" in line:
        return _SYSTEMD_TEXT_RE.match(line) is not None
    return line.startswith("-- ") and _BOOT_RE.fullmatch(line) is not None


class JournalReader:
    """Input lines (bytes, split on ``\\n`` only) -> entries. The format is detected from the first non-empty
    line; a format that cannot be judged line by line, or binary input, raises :class:`UsageError` (exit 2).

    Text is journalctl's ``-o short*`` output when its first line of content (not blank, not a ``-- `` line)
    starts with a journald prefix: then every line's first prefix is the format's and is not part of the message
    (``prefixed``); else each line is a bare message (``-o cat``), taken whole. A message journalctl did not print
    (``[N blob data]`` in text, ``"MESSAGE": null`` in JSON; without ``--all``) comes as ``lines.LEFT_OUT``, a FAIL.
    ``token``, set by the checker, is the judged invocation's token: a text line holding it, or the last
    :data:`~opsctl.gate.lines.MIN_TOKEN_PIECE` characters of it, or one of ``rests`` (what cut-short lines left of
    it), is handed on even without the marker (the gate fails such a message, or the second piece of a line split
    inside its token)."""

    def __init__(self, source: str = "input") -> None:
        self.source = source
        self.format: InputFormat | None = None
        self.prefixed: bool | None = None  # text: journalctl's short* output (None: no line of content yet)
        self.lines = 0
        self.unreadable = 0  # JSON lines that did not parse (judged as text)
        self.left_out = 0  # messages journalctl did not print (JSON null, "[N blob data]"): each judged a FAIL
        self.token: str | None = None
        self.rests: set[str] = set()  # the judged gate's cut_rests (the checker hands its set over)
        self._invocation = ""

    def _detect(self, first: bytes) -> InputFormat:
        head = first.lstrip(b"\x1e").lstrip()
        if head == b"{":
            raise UsageError(f"{self.source}: {_UNSUPPORTED['json-pretty']}")
        if head.startswith((b"__CURSOR=", b"__REALTIME_TIMESTAMP=")):
            raise UsageError(f"{self.source}: {_UNSUPPORTED['export']}")
        if _VERBOSE_RE.match(head):
            raise UsageError(f"{self.source}: {_UNSUPPORTED['verbose']}")
        if head.startswith((b"{", b"data: {")):
            return InputFormat.JSON
        return InputFormat.TEXT

    def read(self, blocks: Iterable[bytes]) -> Iterator[Entry]:
        """The input, in blocks of any size, as entries: in text, only the lines that matter (those holding the
        marker, and restart boundaries; the others are counted); in JSON, every entry."""
        for chunk in complete_lines(blocks):
            nul = chunk.find(b"\x00")
            if nul >= 0:
                number = self.lines + chunk.count(b"\n", 0, nul) + 1
                raise UsageError(
                    f"{self.source}: line {number}: a NUL byte: this is binary, "
                    "not journal text (give journalctl's output: -o short-iso or -o json)"
                )
            if self.format is None:
                self._detect_in(chunk)
            lines = chunk.decode("utf-8", "replace").split("\n")  # as the live gate decodes a byte-array MESSAGE
            base = self.lines
            self.lines += len(lines)
            if self.format is InputFormat.JSON:
                json_entry, skippable = self._json_entry, self._skippable
                for number, line in enumerate(lines, base + 1):
                    if MARKER not in line and skippable(line):
                        continue
                    entry = json_entry(line, number)
                    if entry is not None:
                        yield entry
                continue
            if self.prefixed is None:
                self._detect_prefix(lines)
            prefixed = bool(self.prefixed)
            for number, line in enumerate(lines, base + 1):
                if MARKER in line:
                    yield _new_entry(Entry, (number, line, "", False, False, prefixed, ""))  # Entry(...), minus a frame
                elif (LAUNCH_START in line or "systemd[1]: Start" in line or line.startswith("-- ")) and (
                    _text_boundary(line)
                ):
                    yield Entry(number, line, boundary=True, prefixed=prefixed)
                elif " blob data]" in line and (placeholder := self._blob(line, prefixed)) is not None:
                    yield Entry(number, placeholder)
                elif (token := self.token) is not None and (
                    token[-MIN_TOKEN_PIECE:] in line or (self.rests and any(r in line for r in self.rests))
                ):
                    yield Entry(number, line, "", False, False, prefixed)

    def _detect_prefix(self, lines: list[str]) -> None:
        for line in lines:
            if line.strip() and not line.startswith("-- "):
                self.prefixed = JOURNAL_PREFIX_RE.match(line) is not None
                return

    def _blob(self, line: str, prefixed: bool) -> str | None:
        """``[N blob data]`` (the whole message) -> the LEFT_OUT message; None for any other line."""
        message = line
        if prefixed:
            m = JOURNAL_PREFIX_RE.match(line)
            message = line[m.end() :] if m else line
        if not is_blob_placeholder(message):
            return None
        self.left_out += 1
        return left_out_message(f"{message} in journalctl's text output")

    def _detect_in(self, chunk: bytes) -> None:
        """The format, from the first line that is not blank (none yet: decided by a later chunk)."""
        offset = 0
        while offset <= len(chunk):
            end = chunk.find(b"\n", offset)
            end = len(chunk) if end < 0 else end
            line = chunk[offset:end]
            if line.strip():
                if not _looks_like_text(line):
                    number = self.lines + chunk.count(b"\n", 0, offset) + 1
                    raise UsageError(
                        f"{self.source}: line {number} is not UTF-8 text (binary?): "
                        "give journalctl's output (-o short-iso or -o json)"
                    )
                self.format = self._detect(line)
                return
            offset = end + 1

    def _skippable(self, line: str) -> bool:
        """A JSON entry the check would pass over, told from its raw text without parsing it (json.loads of a
        1 KB entry was most of this format's time): no marker, no piece of the watched token or a rest of it, the
        current invocation's id (given once), one plain string MESSAGE, no ``_LINE_BREAK``, nothing that may start
        the unit. Conservative: journalctl escapes only quotes, backslashes and control characters, so a marker or
        token in the decoded MESSAGE is in the raw line too, unless a ``\\u`` escape spells it (such a line is
        parsed); a key given twice is parsed (the last one wins). The text form skips the same lines."""
        if (
            MARKER in line
            or "\\u" in line
            or "Start" in line
            or LAUNCH_START in line
            or "_LINE_BREAK" in line
            or line.count('"MESSAGE":') != 1
            or '"MESSAGE":"' not in line
            or '"invocation"' in line
        ):
            return False
        body = line.strip()
        if not (body.startswith(("{", "\x1e{", "data: {")) and body.endswith("}")):
            return False
        if (token := self.token) is not None and (
            token[-MIN_TOKEN_PIECE:] in line or (self.rests and any(r in line for r in self.rests))
        ):
            return False
        ids = line.count('"_SYSTEMD_INVOCATION_ID":')
        if ids == 0:
            return True  # systemd's own entries (without the field) keep the current invocation
        current = self._invocation
        return ids == 1 and bool(current) and f'"_SYSTEMD_INVOCATION_ID":"{current}"' in line

    def _json_entry(self, text: str, number: int) -> Entry | None:
        if text[:1] == "{" and text[-1:] == "}":
            body = text  # journalctl -o json: nothing to strip (no copy of a 1 KB line)
        else:
            body = text.lstrip("\x1e").strip()
            if body.startswith("data: "):
                body = body[6:]
        if not body:
            return None
        # json.loads(body), without its Python layers (a third of its time on a 1 KB entry): the C scanner, and the
        # same refusals (trailing data; not JSON; an integer over 4300 digits; nested too deep).
        try:
            doc, end = _SCAN(body, 0)
        except (StopIteration, ValueError, RecursionError):
            doc = end = None
        if end != len(body) or type(doc) is not dict:
            # Not an entry (cut, or not JSON): judged as text, and a marked one is malformed (see _Checker.feed).
            self.unreadable += 1
            return Entry(number, text, unreadable=True)
        if "MESSAGE" in doc:
            value = doc["MESSAGE"]
            if value is None:
                self.left_out += 1
        else:
            value = doc.get("message", "")  # opsctl logs --json
        message = value if type(value) is str else message_text(value)
        invocation = doc.get("_SYSTEMD_INVOCATION_ID") or doc.get("invocation") or ""
        if type(invocation) is not str:
            invocation = str(invocation)
        current = self._invocation
        boundary = bool(invocation and current and invocation != current)
        if invocation:
            self._invocation = invocation
        if not boundary:
            if LAUNCH_START in message:
                boundary = True
            elif message.startswith(("Starting ", "Started ")):
                ident = doc.get("SYSLOG_IDENTIFIER") or doc.get("_COMM")
                boundary = ident == "systemd" or (ident is None and str(doc.get("_PID", "1")) == "1")
        split = line_break(doc) if "_LINE_BREAK" in doc else ""
        return _new_entry(Entry, (number, message, invocation, boundary, False, False, split))


_SCAN = json.scanner.make_scanner(json.JSONDecoder())  # type: ignore[attr-defined]
_new_entry = tuple.__new__
BLOCK_BYTES = 1 << 22  # read at a time; a line longer than this is cut (its start judged, its rest searched)
_TOKEN_IN_TAIL = re.compile(rb"token=([A-Za-z0-9_-]{8,128})")


def complete_lines(blocks: Iterable[bytes]) -> Iterator[bytes]:
    """Blocks of input -> chunks of whole lines (split on ``\\n`` only, the chunk's last ``\\n`` dropped). A line
    longer than BLOCK_BYTES comes as a chunk of its own: its start plus a note naming the tokens in the rest, so
    memory stays bounded and a token at the end of a huge line still makes it one the invocation printed."""
    pending = b""
    cut: tuple[bytes, int, set[bytes], bytes] | None = None  # head, bytes skipped, tokens seen, overlap
    for block in blocks:
        if cut is not None:
            head, skipped, tokens, overlap = cut
            newline = block.find(b"\n")
            part = block if newline < 0 else block[:newline]
            window = overlap + part
            if len(tokens) < 16:
                tokens.update(_TOKEN_IN_TAIL.findall(window))
            skipped += len(part)
            if newline < 0:
                cut = (head, skipped, tokens, window[-140:])
                continue
            yield _cut_line(head, skipped, tokens)
            cut, block = None, block[newline + 1 :]
        data = pending + block if pending else block
        last = data.rfind(b"\n")
        if last >= 0:
            yield data[:last]
            data = data[last + 1 :]
        if len(data) > BLOCK_BYTES:
            head, rest = data[:BLOCK_BYTES], data[BLOCK_BYTES:]
            tokens = set(_TOKEN_IN_TAIL.findall(data[BLOCK_BYTES - 140 :]))
            cut, pending = (head, len(rest), tokens, data[-140:]), b""
        else:
            pending = data
    if cut is not None:
        yield _cut_line(*cut[:3])
    elif pending:
        yield pending


def _cut_line(head: bytes, skipped: int, tokens: set[bytes]) -> bytes:
    seen = b"".join(b" token=" + t for t in sorted(tokens)[:16])
    return head + b" [cut: " + str(skipped).encode() + b" more bytes" + (b";" + seen if seen else b"") + b"]"


def _looks_like_text(first: bytes) -> bool:
    try:
        first[:4096].decode("utf-8")
    except UnicodeDecodeError as e:
        return len(first) > 4096 and e.start >= 4093  # a character cut at the window's end
    return True


@dataclass(frozen=True)
class CheckedLine:
    number: int  # 1-based line number in the input
    judgement: Judgement

    def to_json(self) -> dict[str, object]:
        j = self.judgement
        return {
            "line": self.number,
            "verdict": str(j.verdict),
            "reason": j.reason,
            "layer": j.line.layer if j.line else None,
            "tp": j.line.rank if j.line else None,
            "rel": json_float(j.line.rel) if j.line else None,
            "after_decision": j.after_decision,
            "text": j.raw.strip(),
        }


@dataclass
class Invocation:
    """One gate run over one invocation's lines: its state and what is listed of it."""

    index: int  # 1-based
    state: GateState
    first_line: int = 0
    last_line: int = 0
    parity_lines: int = 0  # parity lines seen (before and after the decision, ignored ones included)
    lines: list[CheckedLine] = field(default_factory=list)  # listed: counted, first ignored, first late failures
    token_fixed: bool = False  # a parity line has set the token (a message journalctl left out does not)
    ignored: int = 0  # every IGNORED judgement (wrong/missing token, marker inside another message)
    counted_unlisted: int = 0
    late: dict[LineVerdict, int] = field(default_factory=lambda: dict.fromkeys(LineVerdict, 0))
    _ignored_listed: int = 0
    _late_listed: int = 0
    _counted_listed: int = 0

    @property
    def token(self) -> str | None:
        return self.state.token

    @property
    def verdict(self) -> Verdict:
        return self.state.verdict

    def add(self, number: int, j: Judgement) -> None:
        """Count one judged message (a parity line, or the marker inside another message)."""
        self._count(number, j.verdict, j.line, j.after_decision, j)

    def add_line(self, number: int, line: ParityLine, verdict: LineVerdict, after_decision: bool) -> None:
        """Count one parity line fed to this invocation's gate; its reason in words is made only if it is listed."""
        self._count(number, verdict, line, after_decision, None)

    def _count(
        self, number: int, verdict: LineVerdict, line: ParityLine | None, late: bool, j: Judgement | None
    ) -> None:
        self.last_line = number
        if line is not None:
            self.parity_lines += 1
        if verdict is LineVerdict.IGNORED:
            self.ignored += 1
            if self._ignored_listed >= MAX_LISTED_IGNORED:
                return
            self._ignored_listed += 1
        elif late:
            self.late[verdict] += 1
            if verdict is not LineVerdict.FAIL or self._late_listed >= MAX_LISTED_LATE:
                return
            self._late_listed += 1
        elif self._counted_listed < MAX_LISTED:
            self._counted_listed += 1
        else:
            self.counted_unlisted += 1
            return
        if j is None:
            assert line is not None
            j = Judgement(verdict, line_reason(self.state, line, verdict), line.raw, line, after_decision=late)
        self.lines.append(CheckedLine(number, j))

    def absorb(self, other: Invocation) -> None:
        """``other`` is this one's continuation (the same token after a restart boundary: an automatic restart
        of the same deploy, which its gate judged as one run). It holds no parity line that set a token yet; the
        lines it counted (messages journalctl left out) are judged again here."""
        for c in other.lines:
            j = c.judgement
            if j.line is not None and j.verdict is not LineVerdict.IGNORED and not j.after_decision:
                decided = self.state.decided
                verdict = self.state.feed(j.line, 0.0)
                j = Judgement(verdict, line_reason(self.state, j.line, verdict), j.raw, j.line, after_decision=decided)
            self.add(c.number, j)
        self.ignored += other.ignored - other._ignored_listed
        self.last_line = max(self.last_line, other.last_line)

    def totals(self) -> dict[str, object]:
        return {
            "ignored": self.ignored,
            "listed": len(self.lines),
            "counted_not_listed": self.counted_unlisted,
            "after_decision": {str(k): v for k, v in self.late.items() if k is not LineVerdict.IGNORED},
        }

    def brief(self) -> dict[str, object]:
        return {
            "index": self.index,
            "token": self.token,
            "first_line": self.first_line,
            "last_line": self.last_line,
            "verdict": str(self.state.verdict),
            "reason": self.state.reason,
            "parity_lines": self.parity_lines,
            "counted": self.state.lines,
            "ignored": self.ignored,
        }


@dataclass
class ParityCheck:
    """The judged invocation (the last one, or the whole text with a given token) and every invocation's
    figures."""

    judged: Invocation
    invocations: list[Invocation]  # every invocation, in input order (the judged one last)
    token_given: bool
    input_lines: int = 0
    input_format: str = "text"
    unreadable: int = 0
    left_out: int = 0  # messages journalctl did not print (see JournalReader.left_out), each a FAIL

    @property
    def state(self) -> GateState:
        return self.judged.state

    @property
    def verdict(self) -> Verdict:
        return self.judged.state.verdict

    @property
    def lines(self) -> list[CheckedLine]:
        return self.judged.lines

    def to_json(self, *, all_invocations: bool = False) -> dict[str, object]:
        st = self.state
        return {
            "verdict": str(st.verdict),
            "reason": st.reason,
            "settings": {
                "pass_rel": st.settings.pass_rel,
                "fail_rel": st.settings.fail_rel,
                "consecutive_passes": st.settings.consecutive_passes,
                "tp": st.expected_ranks,
                "token_checked": st.token is not None,
                "token_given": self.token_given,
            },
            "input": {
                "lines": self.input_lines,
                "format": self.input_format,
                "unreadable_json": self.unreadable,
                "messages_left_out": self.left_out,
            },
            "invocations_seen": len(self.invocations),
            "judged": self.judged.brief(),
            **({"invocations": [inv.brief() for inv in self.invocations]} if all_invocations else {}),
            "summary": {**st.summary(), **self.judged.totals()},
            "lines": [c.to_json() for c in self.judged.lines],
        }


class _Checker:
    """Cuts entries into invocations (without a given token) and feeds each one's gate."""

    def __init__(
        self, settings: GateSettings, tp: int | None, token: str | None, reader: JournalReader | None = None
    ) -> None:
        self.settings, self.tp, self.given = settings, tp, token
        self.reader = reader
        self.done: list[Invocation] = []
        self.current = self._new(1, 1)
        self._watch(token)

    def _watch(self, token: str | None) -> None:
        """Tell the reader the judged invocation's token (a text line holding it comes even without the marker)."""
        if self.reader is not None:
            self.reader.token = token
            self.reader.rests = self.current.state.cut_rests

    def _new(self, index: int, first_line: int) -> Invocation:
        state = GateState(
            settings=self.settings,
            started_at=0.0,
            deadline_s=self.settings.deadline_s,
            expected_ranks=self.tp,
            token=self.given,
        )
        return Invocation(index=index, state=state, first_line=first_line)

    def _start_new(self, first_line: int) -> Invocation:
        old = self.current
        if self.done:
            self.done[-1].lines = []  # two back: never judged, never merged into; keep its figures only
        self.done.append(old)
        self.current = self._new(old.index + 1, first_line)
        return self.current

    def _place(self, token: str | None, number: int) -> Invocation:
        """The invocation a parity line carrying ``token`` (None: none) belongs to."""
        cur = self.current
        if not cur.token_fixed:
            prev = self.done[-1] if self.done else None
            if token is not None and prev is not None and prev.token == token:
                self.done.pop()  # the same token after a boundary: the same deploy's automatic restart
                prev.absorb(cur)
                self.current = prev
                return prev
            cur.state.token, cur.token_fixed = token, True
            self._watch(token)
            return cur
        if token is not None and cur.token is not None and token != cur.token and token.startswith(cur.token):
            # The run's first line showed a token cut short (judged with it: a FAIL that stands); this is the whole.
            cur.state.token = token
            self._watch(token)
            return cur
        if token is not None and token != cur.token and not (cur.token or "").startswith(token):
            # (a token cut short, a strict prefix of this one's, stays here: the gate fails it)
            self._start_new(number)
            return self._place(token, number)
        return cur  # the same token, or a line without one inside a token's run (ignored there)

    def feed(self, entry: Entry) -> None:
        """One entry by the full path (``check_entries`` offers it to :meth:`_late` first)."""
        number, message = entry.number, entry.message
        prefixed = entry.prefixed
        cur = self.current
        if entry.split and split_piece_claimed(cur.state, message):
            # A piece of a message journald cut: never placed by the token it shows (it may show a cut one).
            j = judge(cur.state, message, 0.0, journal_prefix=prefixed, split=entry.split)
            assert j is not None
            cur.add(number, j)
            return
        marked = MARKER in message
        rec = parse_line(message, journal_prefix=prefixed) if marked else None
        if rec is None and marked and entry.unreadable:
            rec = malformed_line(message, "a JSON line that does not parse")
        if self.given is None:
            if entry.boundary and cur.parity_lines:
                cur = self._start_new(number)
            if isinstance(rec, ParityLine):
                if not rec.hidden:  # a message journalctl left out fails the invocation it falls in
                    cur = self._place(rec.token, number)
            elif rec is None and marked and not cur.token_fixed and (loose := loose_token(message)) is not None:
                cur = self._place(loose, number)  # the marker inside another message, first of its invocation
        if isinstance(rec, ParityLine):
            decided = cur.state.decided
            cur.add_line(number, rec, cur.state.feed(rec, 0.0), decided)  # judge_record's steps, reason on demand
        elif (rec is None and marked) or (
            (own := cur.token) is not None and (own[-MIN_TOKEN_PIECE:] in message or cur.state.cut_rests)
        ):
            # The marker inside another message (IGNORED; a FAIL when it holds the token), the token in a message
            # without the marker (a FAIL), or a message that begins with the rest of a token cut short (a FAIL):
            # the gate's judge says which.
            j = judge(cur.state, message, 0.0, journal_prefix=prefixed)
            if j is not None:
                cur.add(number, j)
            else:
                cur.last_line = number
        else:
            cur.last_line = number

    def _late(self, cur: Invocation, entry: Entry) -> bool:
        """A well-formed parity line that changes nothing but the counts and will not be listed (one of the current
        invocation after its gate decided, or one the gate ignores once the ignored lines listed are full):
        counted by its verdict alone (``GateState.well_formed_verdict``, what ``feed`` would say), without a
        ParityLine. Most lines of a long journal come here. False: the full path must take it."""
        message = entry.message
        if MARKER not in message or entry.unreadable or entry.split:
            return False
        fields = fast_fields(message, entry.prefixed)
        if fields is None:
            return False
        token = fields[5]
        if self.given is None and (token is None or token != cur.state.token or not cur.token_fixed):
            return False  # it may start another invocation: the full path places it
        state = cur.state
        verdict = state.well_formed_verdict(fields[4], fields[3], token, message)
        if verdict is LineVerdict.IGNORED:
            if cur._ignored_listed < MAX_LISTED_IGNORED:
                return False  # listed: the full path gives its reason
            state.counts[LineVerdict.IGNORED] += 1
            cur.ignored += 1
        elif verdict is LineVerdict.FAIL or state.verdict is Verdict.PENDING:
            return False  # a FAIL is listed, with its reason; before the decision a line counts
        else:
            cur.late[verdict] += 1
        cur.last_line = entry.number
        cur.parity_lines += 1
        return True

    def finish(self) -> tuple[Invocation, list[Invocation]]:
        for inv in [*self.done, self.current]:
            inv.state.conclude(0.0)
        return self.current, [*self.done, self.current]


def check_entries(
    entries: Iterable[Entry],
    settings: GateSettings,
    *,
    tp: int | None = None,
    token: str | None = None,
    reader: JournalReader | None = None,
) -> ParityCheck:
    """Judge journal entries as the deploy's gate would (see the module's docstring for which lines). ``reader``:
    the :class:`JournalReader` the entries come from (its text format, and the token it watches for)."""
    checker = _Checker(settings, tp, token, reader)
    feed, late = checker.feed, checker._late
    for entry in entries:
        cur = checker.current
        # The lane first (most lines of a long journal: after the decision, or ignored), then the full path.
        if entry.boundary or not late(cur, entry):
            feed(entry)
    judged, invocations = checker.finish()
    return ParityCheck(judged=judged, invocations=invocations, token_given=token is not None)


def check_journal(
    text: Iterable[str] | str,
    settings: GateSettings,
    *,
    tp: int | None = None,
    token: str | None = None,
    source: str = "input",
) -> ParityCheck:
    """Journal text (a string, split on ``\\n`` only, or its lines) -> the check. For tests and callers that hold
    the text; the CLI streams bytes through :class:`JournalReader` itself."""
    data = text if isinstance(text, str) else "\n".join(x.rstrip("\n") for x in text)
    reader = JournalReader(source)
    result = check_entries(reader.read([data.encode()]), settings, tp=tp, token=token, reader=reader)
    result.input_lines, result.unreadable, result.left_out = reader.lines, reader.unreadable, reader.left_out
    result.input_format = str(reader.format or InputFormat.TEXT)
    return result
