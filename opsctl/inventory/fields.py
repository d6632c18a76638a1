"""The inventory's value types: each field that ends up in a shell command, a unit file or a filesystem path is
checked here once, so the rest of the code can trust it (and still quotes every remote command)."""

from __future__ import annotations

import re
import shlex
import urllib.parse
from typing import Annotated, Any

from pydantic import AfterValidator, SecretStr

# Always used with fullmatch: "$" alone would accept a trailing newline ("DDTREE\n").
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")
_UNIT_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@-]{0,127}")
_ADDRESS_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,252}")
_ARCH_RE = re.compile(r"\d{1,2}\.\d")
_ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
# A plain absolute URL path: no %-escapes (a second decoding could turn them into anything), no ';' (path
# parameters), no query, no '..' or '.' segment; it goes into an HTTP request line on the host.
_HTTP_PATH_RE = re.compile(r"/[A-Za-z0-9._~/-]{0,255}")
# Characters with a meaning to a shell, plus whitespace; a path or argument containing one is refused outright.
_SHELL_META = set(";&|$`\\\"'<>(){}[]*?!#~\n\r\t ")


# Unicode's category Cc is exactly C0, DEL and C1: searched by the regex engine (one pass in C, not a Python loop
# over every character of an 8 MB inventory).
_CONTROL_RE = re.compile("[\x00-\x1f\x7f-\x9f]")


def control_character(value: str) -> str | None:
    """The first control character in ``value`` (NUL, CR, LF, TAB, DEL, C1 ...), named for an error message."""
    m = _CONTROL_RE.search(value)
    return f"U+{ord(m.group()):04X}" if m else None


def no_control_characters(value: Any) -> Any:
    """Every string field of the inventory (and each string of a list field): a NUL, CR or LF in a value could end a line of the
    rendered unit file and start a directive of its own (ExecStartPre=...)."""
    if isinstance(value, str):
        bad = control_character(value)
        if bad:
            raise ValueError(f"contains the control character {bad}; inventory values must be plain text")
    elif isinstance(value, list | tuple):
        for item in value:
            no_control_characters(item)
    return value


def _http_path(value: str) -> str:
    segments = value.split("/")[1:]
    if not _HTTP_PATH_RE.fullmatch(value) or "//" in value or ".." in segments or "." in segments:
        raise ValueError(
            f"{value!r} must be a plain absolute URL path: one leading '/', then letters, digits, '.', '_', '~', "
            "'-' and '/'; no '..' or '.' segment, '%'-escape, ';', query or fragment (it is the path of "
            "http://127.0.0.1:<port>)"
        )
    return value


class WebhookUrl(SecretStr):
    """A webhook URL: often holds a secret (a token in the path or query), so every output shows only the scheme
    and host; ``get_secret_value()`` is for the one place that posts to it."""

    def _display(self) -> str:
        parts = urllib.parse.urlsplit(self.get_secret_value())
        return f"{parts.scheme}://{parts.hostname or '?'}/... (redacted)"


def _webhook(value: WebhookUrl) -> WebhookUrl:
    # The value is never echoed: the error message would print the secret.
    text = value.get_secret_value()
    try:
        parts = urllib.parse.urlsplit(text)
        host = parts.hostname
    except ValueError:
        raise ValueError("is not a parsable URL (value not shown: webhook URLs often hold secrets)") from None
    if parts.scheme not in ("http", "https") or not host or any(c.isspace() for c in text):
        raise ValueError("must be an http:// or https:// URL with a host (value not shown: it may hold a secret)")
    if "@" in parts.netloc:
        # urllib does not send user:password@ as credentials (it reads the password as a port and fails), and
        # every error would quote it: put a token in the path or query instead, which opsctl never prints.
        raise ValueError(
            "must not carry a user name or password (user:password@host); put the token in the URL's path or "
            "query (value not shown)"
        )
    try:
        parts.port  # noqa: B018 - raises on a port that is not a number, as delivery would
    except ValueError:
        raise ValueError("has a port that is not a number (value not shown: it may hold a secret)") from None
    return value


# An alert command is a program and a few arguments. The cap is checked before anything else: shlex's splitting
# is quadratic in a word's length (a 1 MB value took 23 s), and the inventory may be 8 MB.
MAX_ALERT_COMMAND_CHARS = 4096
_SHELL_SYNTAX = ("$(", "`", ";", "\n", "&&", "|")
_ASSIGNMENT_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")


def _alert_command(value: str) -> str:
    # The value is never quoted in a message: its arguments often carry a token or a webhook URL.
    if len(value) > MAX_ALERT_COMMAND_CHARS:
        raise ValueError(
            f"has {len(value):,} characters; an alert command may have at most {MAX_ALERT_COMMAND_CHARS:,} "
            "(value not shown: its arguments may hold secrets)"
        )
    syntax = [s for s in _SHELL_SYNTAX if s in value]
    if syntax:
        raise ValueError(
            f"contains shell syntax ({', '.join(repr(s) for s in syntax)}): it runs without a shell "
            "(value not shown: its arguments may hold secrets)"
        )
    try:
        argv = shlex.split(value)
    except ValueError as e:
        raise ValueError(f"does not split into words: {e} (value not shown: its arguments may hold secrets)") from None
    if not argv:
        raise ValueError("names no program to run")
    if _ASSIGNMENT_RE.match(argv[0]):
        # `TOKEN=x /bin/notify` is shell syntax (no shell runs it: the program would be "TOKEN=x"), and its
        # redacted form would show the secret as the program's name.
        name = argv[0].split("=", 1)[0]
        raise ValueError(
            f"starts with a variable assignment ({name}=...): it runs without a shell; name the program first, and "
            "keep secrets out of the inventory (the alert gets OPSCTL_ALERT_* in its environment; value not shown)"
        )
    return value


def redacted_command(value: str) -> str:
    """An alert command as every output shows it: its program only (its arguments often carry a token or a
    webhook URL, and `hosts --json` output ends up in tickets and logs)."""
    words = shlex.split(value)
    return words[0] + (" ... (arguments redacted)" if len(words) > 1 else "") if words else ""


def safe_name(value: str) -> str:
    if not NAME_RE.fullmatch(value):
        raise ValueError(f"{value!r} is not a safe name (letters, digits, '_', '.', '-'; max 63)")
    return value


def _unit_name(value: str) -> str:
    if not _UNIT_RE.fullmatch(value) or ".." in value:
        raise ValueError(f"{value!r} is not a valid systemd unit name (no spaces, '/', or shell characters)")
    return value


def _address(value: str) -> str:
    if not _ADDRESS_RE.fullmatch(value):
        raise ValueError(f"{value!r} is not a hostname or IP address")
    return value


def _abs_path(value: str) -> str:
    bad = sorted(set(value) & (_SHELL_META - {"~"}))
    if bad:
        raise ValueError(f"{value!r} contains characters unsafe in a shell or path: {''.join(bad)!r}")
    if not value.startswith("/"):
        raise ValueError(f"{value!r} must be an absolute path")
    parts = value.split("/")
    if ".." in parts or "." in parts[1:]:
        raise ValueError(f"{value!r} must not contain '.' or '..' components")
    if value.rstrip("/") in ("", "/root", "/home", "/etc", "/usr", "/var", "/opt", "/tmp", "/bin", "/lib"):
        raise ValueError(f"{value!r} is a system directory; a release root must be a directory of its own")
    return value.rstrip("/")


def _local_path(value: str) -> str:
    bad = sorted(set(value) & (_SHELL_META - {"~"}))
    if bad:
        raise ValueError(f"{value!r} contains characters unsafe in a shell or path: {''.join(bad)!r}")
    return value


def _shell_arg(value: str) -> str:
    if "$(" in value or "`" in value or ";" in value or "\n" in value or "&&" in value or "|" in value:
        raise ValueError(f"{value!r} contains shell syntax")
    return value


def _env_name(value: str) -> str:
    if not _ENV_NAME_RE.fullmatch(value):
        raise ValueError(f"{value!r} is not an environment variable name (letters, digits, '_'; not a digit first)")
    return value


def _arch(value: str) -> str:
    if not _ARCH_RE.fullmatch(value):
        raise ValueError(f"{value!r} is not a compute capability like '12.0' or '9.0'")
    return value


SafeName = Annotated[str, AfterValidator(safe_name)]
UnitName = Annotated[str, AfterValidator(_unit_name)]
Address = Annotated[str, AfterValidator(_address)]
RemotePath = Annotated[str, AfterValidator(_abs_path)]
LocalPath = Annotated[str, AfterValidator(_local_path)]
ShellArg = Annotated[str, AfterValidator(_shell_arg)]
HttpPath = Annotated[str, AfterValidator(_http_path)]
Webhook = Annotated[WebhookUrl, AfterValidator(_webhook)]
AlertCommand = Annotated[str, AfterValidator(_alert_command)]
GpuArch = Annotated[str, AfterValidator(_arch)]
EnvName = Annotated[str, AfterValidator(_env_name)]
