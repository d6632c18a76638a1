"""Text from elsewhere on the operator's terminal: the one helper every view uses to show text that came from a host,
a journal or a sample (docs/operator-view.md "Untrusted text").

A release, or anyone who can write to the journal, chooses the bytes of a parity line, a log message, an HTTP error
or a file's name. Printed raw, ESC starts a CSI or OSC sequence (clear the screen, set the window title, rewrite an
earlier line), a C1 control does the same in one byte, and a bidi override (U+202E) or a line separator (U+2028)
makes the text read as something else. :func:`escaped` shows each such character as a Python-style escape
(``\\x1b``, ``\\u202e``) and leaves printable text alone (the common case costs one ``str.isprintable``).

Standard library only, on the lowest floor: the inventory, the lock and the CLI all use it."""

from __future__ import annotations

import re
from functools import lru_cache

_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _code(ch: str) -> str:
    named = _NAMED.get(ch)
    if named is not None:
        return named
    n = ord(ch)
    return f"\\x{n:02x}" if n < 0x100 else (f"\\u{n:04x}" if n < 0x10000 else f"\\U{n:08x}")


def _escape_run(text: str) -> str:
    # Not printable in Python's sense: every control (C0, DEL, C1), format character (bidi controls, zero-width
    # joiners, U+FEFF), line and paragraph separator, surrogate (undecodable bytes), unassigned code point and
    # every space but U+0020.
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else _code(ch) for ch in text)


@lru_cache(maxsize=8)
def _splitter(keep: str) -> re.Pattern[str]:
    return re.compile(f"([{re.escape(keep)}])")


def escaped(text: str, keep: str = "") -> str:
    """``text`` with every character that is not printable shown as an escape (``\\x1b``, ``\\x9b``, ``\\u202e``,
    ``\\u2028``, ``\\n``). ``keep``: characters left as they are (``"\\n"`` where the text is opsctl's own
    multi-line output and only its pieces came from elsewhere)."""
    if not keep or text.isprintable():
        return _escape_run(text)
    parts = _splitter(keep).split(text)
    # re.split with a group: the kept characters are the odd parts.
    return "".join(part if i % 2 else _escape_run(part) for i, part in enumerate(parts))
