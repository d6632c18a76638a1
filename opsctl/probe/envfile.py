"""The API key on the host: a systemd EnvironmentFile read as systemd reads it, and the one value the probe sends.

Part of the probe's host program (opsctl/probe/traffic_on_host.py): standard library only, Python 3.10.
"""

from __future__ import annotations

from typing import Any

NEWLINE = "\n\r"
BLANK = " \t\n\r"
# The states whose assignment is complete when the text ends (the others hold a key without '=' or a comment).
VALUE_STATES = ("pre_value", "value", "value_escape", "single", "double", "double_escape")
# What a backslash inside "..." escapes; before anything else it is kept.
DOUBLE_ESCAPED = '"\\`$'


def is_variable_name(name: str) -> bool:
    """An ASCII shell variable name: a letter or ``_`` first, then letters, digits and ``_``."""
    first_ok = bool(name) and (name[0].isalpha() or name[0] == "_")
    return first_ok and name.isascii() and all(c.isalnum() or c == "_" for c in name)


def blank_run_start(start: int | None, length: int, c: str) -> int | None:
    """Where the trailing run of whitespace starts once ``c`` is appended at index ``length`` (None: no such run)."""
    if c not in BLANK:
        return None
    return length if start is None else start


class EnvFileReader:
    """systemd's env-file parser as a state machine: one handler per state (``STATES``), each taking one character
    and returning the next state. The key and value grow in lists; ``key_ws``/``value_ws`` mark where their
    trailing whitespace starts (cut when the assignment is pushed)."""

    def __init__(self) -> None:
        self.out: dict[str, str] = {}
        self.key: list[str] = []
        self.value: list[str] = []
        self.key_ws: int | None = None
        self.value_ws: int | None = None

    def push(self) -> None:
        name = "".join(self.key[: self.key_ws] if self.key_ws is not None else self.key)
        if is_variable_name(name):
            self.out[name] = "".join(self.value[: self.value_ws] if self.value_ws is not None else self.value)

    def end_line(self) -> str:
        self.push()
        return "pre_key"

    def pre_key(self, c: str) -> str:
        if c in "#;":
            return "comment"
        if c in BLANK:
            return "pre_key"
        self.key, self.value, self.key_ws, self.value_ws = [c], [], None, None
        return "key"

    def in_key(self, c: str) -> str:
        if c in NEWLINE:
            return "pre_key"  # a line without '=': ignored
        if c == "=":
            self.value_ws = None
            return "pre_value"
        self.key_ws = blank_run_start(self.key_ws, len(self.key), c)
        self.key.append(c)
        return "key"

    def pre_value(self, c: str) -> str:
        if c in NEWLINE:
            return self.end_line()
        opening = {"'": "single", '"': "double", "\\": "value_escape"}.get(c)
        if opening is not None or c in BLANK:
            return opening or "pre_value"
        self.value.append(c)
        return "value"

    def in_value(self, c: str) -> str:
        if c in NEWLINE:
            return self.end_line()
        if c == "\\":
            self.value_ws = None
            return "value_escape"
        self.value_ws = blank_run_start(self.value_ws, len(self.value), c)
        self.value.append(c)
        return "value"

    def value_escape(self, c: str) -> str:
        if c not in NEWLINE:  # a backslash-newline continues the line
            self.value.append(c)
        return "value"

    def single(self, c: str) -> str:
        if c == "'":
            return "pre_value"
        self.value.append(c)
        return "single"

    def double(self, c: str) -> str:
        if c in '"\\':
            return "pre_value" if c == '"' else "double_escape"
        self.value.append(c)
        return "double"

    def double_escape(self, c: str) -> str:
        if c in DOUBLE_ESCAPED:
            self.value.append(c)
        elif c != "\n":
            self.value.extend(("\\", c))
        return "double"

    def comment(self, c: str) -> str:
        if c == "\\":
            return "comment_escape"
        return "pre_key" if c in NEWLINE else "comment"

    def comment_escape(self, c: str) -> str:
        return "comment"

    def read(self, text: str) -> dict[str, str]:
        states: dict[str, Any] = {
            "pre_key": self.pre_key,
            "key": self.in_key,
            "pre_value": self.pre_value,
            "value": self.in_value,
            "value_escape": self.value_escape,
            "single": self.single,
            "double": self.double,
            "double_escape": self.double_escape,
            "comment": self.comment,
            "comment_escape": self.comment_escape,
        }
        state = "pre_key"
        for c in text:
            state = states[state](c)
        if state in VALUE_STATES:
            self.push()
        return self.out


def parse_environment_file(text: str) -> dict[str, str]:
    """A systemd EnvironmentFile's assignments, read as systemd reads them (its env-file parser): a line ends at
    ``\n`` or ``\r`` only (never at U+0085, U+2028, form feeds: ``str.splitlines`` would split there and let
    ``OTHER=x\x85KEY=injected`` set KEY); ``#`` or ``;`` first on a line makes a comment (a backslash at its end
    continues it); whitespace around the key and after ``=`` is dropped, as is trailing whitespace of an unquoted
    value; ``'...'`` is taken literally; in ``"..."`` a backslash escapes ``"``, ``\\``, `` ` `` and ``$`` and
    is kept before anything else, and a backslash-newline is dropped; an unquoted backslash escapes the next
    character (a backslash-newline continues the line); quoted and unquoted parts next to each other join. A key
    that is not a variable name is ignored; the last assignment wins."""
    return EnvFileReader().read(text)


def header_problem(value: str) -> bool:
    """Whether ``value`` cannot be sent as an HTTP header value: a character outside Latin-1 (http.client encodes
    headers as Latin-1) or a control character (C0, DEL, C1: a CR or LF would end the header)."""
    return any(ord(c) > 0xFF or ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F for c in value)


def read_env_value(path: str | None, name: str) -> tuple[str | None, str | None]:
    """The API key: ``name``'s value in the systemd EnvironmentFile ``path`` -> (value or None, why no key is sent
    or None). A file that does not exist is no key (systemd's ``EnvironmentFile=-`` ignores it too); an
    unreadable one, or one that is not UTF-8 (systemd refuses it), is reported without its content. A value that
    cannot go in an HTTP header is refused; the message never shows the value or any character of it."""
    if not path:
        return None, None
    try:
        with open(path, "rb") as fh:
            raw = fh.read(1 << 20)
    except FileNotFoundError:
        return None, None
    except OSError as e:
        return None, f"cannot read {path}: {e.strerror or type(e).__name__}"
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return None, f"{path} is not UTF-8 text (systemd refuses it too)"
    value = parse_environment_file(text).get(name)
    if value and header_problem(value):
        return None, (
            f"${name} in {path} cannot be sent in an HTTP header (it holds a character outside Latin-1 or a "
            "control character); the key is not shown"
        )
    return (value or None), None
