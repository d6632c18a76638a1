"""A stored journal read as entries: journalctl's text (``-o short*``, ``-o cat``) or JSON output (``-o json``,
``json-seq``, ``json-sse``; also ``opsctl logs`` output), as ``opsctl parity check`` reads a file or stdin.

Pure over data: :class:`JournalReader` turns input lines (bytes, split on ``\\n`` only, as the live gate's journal
messages are) into :class:`~opsctl.journal.entry.Entry` values; what they mean is the gate's business
(``opsctl/gate/parity_check.py``). Here too: the journald prefix every ``-o short*`` line starts with
(:data:`JOURNAL_PREFIX_RE`), journalctl's ``[N blob data]`` marker for a message it did not print, the restart
boundaries (systemd starting the unit, the launcher's first line, ``-- Boot``, a new ``_SYSTEMD_INVOCATION_ID``) and
:func:`complete_lines`, which cuts blocks of input into whole lines with bounded memory.
"""

from __future__ import annotations

import json
import json.scanner
import re
from collections.abc import Iterable, Iterator
from enum import StrEnum
from itertools import chain
from typing import Any

from kdtree_backend.wire import MARKER

from ..errors import UsageError
from .entry import Entry, left_out_message
from .query import line_break, message_text

# journalctl -o short / short-precise / short-iso / short-iso-precise / short-full / short-unix / short-monotonic /
# short-delta / with-unit: "<time> <host> <ident>[<pid>]: ". re.ASCII: [0-9] and \d never match other digits.
_TIMESTAMP = (
    r"(?:[A-Z][a-z]{2} [ 0-9][0-9] [0-9]{2}:[0-9]{2}:[0-9]{2}(?:\.[0-9]+)?"  # short, short-precise
    r"|[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(?:[.,][0-9]+)?(?:Z|[+-][0-9]{2}:?[0-9]{2})?"  # iso
    r"|[A-Z][a-z]{2} [0-9]{4}-[0-9]{2}-[0-9]{2} [0-9]{2}:[0-9]{2}:[0-9]{2}(?:\.[0-9]+)? [A-Za-z0-9+-]{1,8}"  # full
    r"|[0-9]{1,12}\.[0-9]{1,9}"  # short-unix
    r"|\[ *[0-9]{1,12}\.[0-9]{1,9}(?: <[ 0-9]*\.[0-9]+>)?\])"  # short-monotonic, short-delta
)
JOURNAL_PREFIX = rf"{_TIMESTAMP} \S+ [^\s\[\]:]+(?:\[[0-9]+\])?: "  # the pattern's text (the line parser extends it)
JOURNAL_PREFIX_RE = re.compile(JOURNAL_PREFIX, re.ASCII)  # a line of journalctl's short* output starts so
# What journalctl writes without --all for a message it will not print: "[76B blob data]", "[5.0K blob data]".
_BLOB_RE = re.compile(r"\[[0-9]+(?:\.[0-9])?[BKMGTPE] blob data\]", re.ASCII)


class InputFormat(StrEnum):
    TEXT = "text"  # journalctl -o short* / cat, or bare messages; also `opsctl logs` output
    JSON = "json"  # journalctl -o json / json-seq / json-sse, or `opsctl logs --json`


def is_blob_placeholder(message: str) -> bool:
    """journalctl's ``[N blob data]``, written for a message it will not print without ``--all``."""
    return _BLOB_RE.fullmatch(message) is not None


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
    (``[N blob data]`` in text, ``"MESSAGE": null`` in JSON; without ``--all``) comes as ``wire.LEFT_OUT``, a FAIL.
    ``watched``, set by whoever judges the entries (the parity check: the last characters of the judged
    invocation's token), and ``rests`` (a set it keeps filling: what cut-short lines left of that token): a text
    line holding one of them is handed on even without the marker."""

    def __init__(self, source: str = "input") -> None:
        self.source = source
        self.format: InputFormat | None = None
        self.prefixed: bool | None = None  # text: journalctl's short* output (None: no line of content yet)
        self.lines = 0
        self.unreadable = 0  # JSON lines that did not parse (judged as text)
        self.left_out = 0  # messages journalctl did not print (JSON null, "[N blob data]"): each judged a FAIL
        self.watched: str | None = None
        self.rests: set[str] = set()
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
        # (chained in C: an entry passes through one generator, not two)
        return chain.from_iterable(map(self._chunk_entries, complete_lines(blocks)))

    def _chunk_entries(self, chunk: bytes) -> Iterator[Entry]:
        """One chunk of whole lines (:func:`complete_lines`) as entries."""
        self._refuse_binary(chunk)
        if self.format is None:
            self._detect_in(chunk)
        lines = chunk.decode("utf-8", "replace").split("\n")  # as the live gate decodes a byte-array MESSAGE
        base = self.lines
        self.lines += len(lines)
        if self.format is InputFormat.JSON:
            return self._json_entries(lines, base)
        return self._text_entries(lines, base)

    def _refuse_binary(self, chunk: bytes) -> None:
        nul = chunk.find(b"\x00")
        if nul >= 0:
            number = self.lines + chunk.count(b"\n", 0, nul) + 1
            raise UsageError(
                f"{self.source}: line {number}: a NUL byte: this is binary, "
                "not journal text (give journalctl's output: -o short-iso or -o json)"
            )

    def _json_entries(self, lines: list[str], base: int) -> Iterator[Entry]:
        json_entry, skippable = self._json_entry, self._skippable
        for number, line in enumerate(lines, base + 1):
            if MARKER not in line and skippable(line):
                continue
            entry = json_entry(line, number)
            if entry is not None:
                yield entry

    def _text_entries(self, lines: list[str], base: int) -> Iterator[Entry]:
        if self.prefixed is None:
            self._detect_prefix(lines)
        prefixed = bool(self.prefixed)
        marker, new_entry = MARKER, _new_entry  # (locals: read for every line)
        for number, line in enumerate(lines, base + 1):
            if marker in line:
                yield new_entry(Entry, number, line, "", False, False, prefixed)
            elif (LAUNCH_START in line or "systemd[1]: Start" in line or line.startswith("-- ")) and (
                _text_boundary(line)
            ):
                yield Entry(number, line, boundary=True, prefixed=prefixed)
            elif " blob data]" in line and (placeholder := self._blob(line, prefixed)) is not None:
                yield Entry(number, placeholder)
            elif (watched := self.watched) is not None and (
                watched in line or (self.rests and any(r in line for r in self.rests))
            ):  # (self._watches(line), without a call for each line of text)
                yield Entry(number, line, "", False, False, prefixed)

    def _watches(self, line: str) -> bool:
        """The line holds the watched text or one of the rests."""
        watched = self.watched
        return watched is not None and (watched in line or bool(self.rests and any(r in line for r in self.rests)))

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
        1 KB entry was most of this format's time): no marker, not watched (:meth:`_watches`), the current
        invocation's id (given once), one plain string MESSAGE, no ``_LINE_BREAK``, nothing that may start the
        unit. Conservative: journalctl escapes only quotes, backslashes and control characters, so a marker or
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
        if not (body.startswith(("{", "\x1e{", "data: {")) and body.endswith("}")) or self._watches(line):
            return False
        ids = line.count('"_SYSTEMD_INVOCATION_ID":')
        if ids == 0:
            return True  # systemd's own entries (without the field) keep the current invocation
        current = self._invocation
        return ids == 1 and bool(current) and f'"_SYSTEMD_INVOCATION_ID":"{current}"' in line

    def _json_entry(self, text: str, number: int) -> Entry | None:
        body = text if text[:1] == "{" and text[-1:] == "}" else _json_body(text)  # (-o json: as it is, no copy)
        if not body:
            return None
        doc = _json_object(body)
        if doc is None:
            # Not an entry (cut, or not JSON): judged as text, and a marked one is malformed (the checker's feed).
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
        boundary = bool(invocation and current and invocation != current)  # another invocation than the last seen
        if invocation:
            self._invocation = invocation
        if not boundary and (LAUNCH_START in message or message.startswith(("Starting ", "Started "))):
            boundary = _starts_the_unit(doc, message)
        split = line_break(doc) if "_LINE_BREAK" in doc else ""
        return _new_entry(Entry, number, message, invocation, boundary, False, False, split)


def _json_body(text: str) -> str:
    """The JSON document of one line of json-seq (a leading RS), json-sse (``data: ``) or -o json with blanks."""
    body = text.lstrip("\x1e").strip()
    return body[6:] if body.startswith("data: ") else body


def _json_object(body: str) -> dict[str, Any] | None:
    """json.loads(body) when it is an object, without json.loads' Python layers (a third of its time on a 1 KB
    entry): the C scanner, and the same refusals (trailing data; not JSON; an integer over 4300 digits; nested too
    deep). None: not an object."""
    try:
        doc, end = _SCAN(body, 0)
    except (StopIteration, ValueError, RecursionError):
        return None
    return doc if end == len(body) and type(doc) is dict else None


def _starts_the_unit(doc: dict[str, Any], message: str) -> bool:
    """The launcher's first line, or systemd starting the unit."""
    if LAUNCH_START in message:
        return True
    if message.startswith(("Starting ", "Started ")):
        ident = doc.get("SYSLOG_IDENTIFIER") or doc.get("_COMM")
        return ident == "systemd" or (ident is None and str(doc.get("_PID", "1")) == "1")
    return False


# Entry(...) for every marked line of a long journal, without type.__call__ finding the NamedTuple's __new__ each
# time (a third of the cost of making one, Python 3.11).
_new_entry = Entry.__new__
_SCAN = json.scanner.make_scanner(json.JSONDecoder())  # type: ignore[attr-defined]
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
