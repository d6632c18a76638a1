"""The ``[kdtree]`` stdout lines (docs/lines.md): formatting (pure) and emission (one write of the whole line).

Every parity line names the TP rank that computed it (``tp=``) and carries the token of this invocation
(``token=``, from ``$KDTREE_PARITY_TOKEN``, which opsctl writes fresh before each restart): the deploy gate counts
only lines with the token it handed out, so text that merely looks like a parity line cannot pass it.
"""

from __future__ import annotations

import math
import os
import sys
import threading
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import TextIO

from .wire import MARKER, PARITY_TOKEN_VAR, PARITY_VALUE_MAX, TOKEN_RE


@dataclass(frozen=True)
class ParityIdentity:
    """Who prints a parity line: the tensor-parallel rank, and the invocation's token (None when unset)."""

    tp: int = 0
    token: str | None = None

    @staticmethod
    def from_env(tp: int = 0, environ: Mapping[str, str] | None = None) -> ParityIdentity:
        """The token from the environment; a malformed one is dropped (the gate then ignores our lines, which
        fails the deploy loudly rather than letting a token with spaces break the line's fields)."""
        raw = (os.environ if environ is None else environ).get(PARITY_TOKEN_VAR, "").strip()
        return ParityIdentity(tp=int(tp), token=raw if TOKEN_RE.fullmatch(raw) else None)


def _shape(shape: Sequence[int]) -> str:
    return str(tuple(int(d) for d in shape))


def format_shapes(
    *,
    q: Sequence[int],
    kv_buf: Sequence[int],
    bs: int,
    q_len: int,
    dl: int,
    dr: int,
    kv_len_max: int,
    scale: float,
    mask: Sequence[int],
    **extra: object,
) -> str:
    """``[kdtree] shapes q=(9, 8, 576) kv_buf=(195012, 576) bs=1 q_len=9 Dl=512 Dr=64 kv_len_max=30 ...``"""
    line = (
        f"{MARKER} shapes q={_shape(q)} kv_buf={_shape(kv_buf)} bs={bs} q_len={q_len} Dl={dl} Dr={dr} "
        f"kv_len_max={kv_len_max} scale={scale:.5f} mask={_shape(mask)}"
    )
    return line + "".join(f" {key}={value}" for key, value in extra.items())


def format_parity(
    layer: int, max_abs_diff: float, mean: float, rel: float, identity: ParityIdentity, **extra: object
) -> str:
    """``[kdtree] L56 max_abs_diff=1.6934e+00 mean=1.1948e-01 rel=1.0837e+00 tp=0 token=...``

    A finite value above ``PARITY_VALUE_MAX`` is printed as that (it still fails any gate), so every finite value
    prints as a number opsctl's parser reads back; NaN, an infinity or a negative value prints as Python writes it,
    which the parser refuses: a FAIL, as it must be."""
    max_abs_diff, mean, rel = (
        PARITY_VALUE_MAX if PARITY_VALUE_MAX < v < math.inf else v for v in (max_abs_diff, mean, rel)
    )
    line = f"{MARKER} L{layer} max_abs_diff={max_abs_diff:.4e} mean={mean:.4e} rel={rel:.4e} tp={identity.tp}"
    if identity.token is not None:
        line += f" token={identity.token}"
    return line + "".join(f" {key}={value}" for key, value in extra.items())


def format_fallback(reason: str, **extra: object) -> str:
    """``[kdtree] fallback reason=fp8_kv_cache path=triton``"""
    return f"{MARKER} fallback reason={reason}" + "".join(f" {key}={value}" for key, value in extra.items())


# One line at a time from this process's threads; re-entrant because a signal handler (the services' SIGTERM
# line) runs in the main thread, possibly while that thread is inside write_line.
_WRITE_LOCK = threading.RLock()


def _fileno(stream: TextIO) -> int | None:
    try:
        return stream.fileno()
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is an OSError and a ValueError
        return None


def write_line(line: str, *, stderr: bool = False) -> None:
    """``line`` and its newline as ONE write to stdout (or stderr), under a process-wide lock.

    ``print(line)`` writes the text and the newline separately (two syscalls when unbuffered), so another
    thread's line could land between them and journald would see two messages glued into one (issue 36: a
    ``served rid=...`` line carrying a parity line). Here the whole line goes out in one ``os.write`` on the
    stream's file descriptor; no thread of this process writes in between, and a write of at most PIPE_BUF
    (4096) bytes to a pipe is not interleaved with other processes' writes either. Text already buffered in
    ``sys.stdout`` is flushed first, so the order of lines is kept. A stream with no file descriptor (a test's
    capture) gets the whole line in one ``write`` call."""
    stream = sys.stderr if stderr else sys.stdout
    line = line.replace("\r", "\\r").replace("\n", "\\n")  # one line stays one line (a logged rid, say)
    data = (line + "\n").encode("utf-8", "backslashreplace")
    with _WRITE_LOCK:
        stream.flush()
        fd = _fileno(stream)
        if fd is None:
            stream.write(line + "\n")
            stream.flush()
            return
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]


def emit(line: str) -> None:
    """A ``[kdtree]`` line to stdout (journald under systemd): one write of the whole line with its newline, at
    once, so that the deploy gate sees it without delay and whole (:func:`write_line`)."""
    write_line(line)


class OncePer:
    """Calls ``emit`` with a line the first time a key is seen (shapes per signature, fallback per reason)."""

    def __init__(self, sink: Callable[[str], None] = emit) -> None:
        self._seen: set[Hashable] = set()
        self._sink = sink

    def __call__(self, key: Hashable, line: str | Callable[[], str]) -> bool:
        if key in self._seen:
            return False
        self._seen.add(key)
        self._sink(line() if callable(line) else line)
        return True
