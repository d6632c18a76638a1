"""SIGTERM and SIGHUP handled like Ctrl-C, and held while a host is being restored."""

from __future__ import annotations

import contextlib
import functools
import signal
import threading
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any, TypeVar

from .report import Reporter


class Interrupted(KeyboardInterrupt):
    """SIGTERM or SIGHUP, handled like Ctrl-C: the deploy restores a consistent host before it ends."""

    def __init__(self, signal_name: str) -> None:
        super().__init__(signal_name)
        self.signal_name = signal_name


_STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)
_ALL_STOP_SIGNALS = (signal.SIGINT, *_STOP_SIGNALS)


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


F = TypeVar("F", bound=Callable[..., Any])


def interruptible(fn: F) -> F:
    """Run ``fn`` with SIGTERM and SIGHUP raising ``Interrupted`` (as SIGINT raises KeyboardInterrupt), so a
    service manager's stop or a closed terminal restores the host like Ctrl-C does. Only the main thread can
    install handlers; elsewhere (a fleet's worker threads) the process's own handling applies."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if not _in_main_thread():
            return fn(*args, **kwargs)

        def handler(signum: int, _frame: FrameType | None) -> None:
            raise Interrupted(signal.Signals(signum).name)

        old = {sig: signal.signal(sig, handler) for sig in _STOP_SIGNALS}
        try:
            return fn(*args, **kwargs)
        finally:
            for sig, previous in old.items():
                signal.signal(sig, previous)

    return wrapper  # type: ignore[return-value]


@contextlib.contextmanager
def signals_held(rep: Reporter) -> Iterator[None]:
    """While restoring a host, a second Ctrl-C/SIGTERM/SIGHUP must not abandon it half-way: they are noted, not
    acted on. (Handlers rather than a signal mask: Python runs handlers in the main thread whichever thread the
    kernel delivers to, so a mask on one thread would not hold them.)"""
    if not _in_main_thread():
        yield
        return

    def note(signum: int, _frame: FrameType | None) -> None:
        rep.info(f"{signal.Signals(signum).name} received: still restoring the host, it ends when that is done")

    old = {sig: signal.signal(sig, note) for sig in _ALL_STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, previous in old.items():
            signal.signal(sig, previous)


def interruption(e: BaseException) -> str:
    return f"interrupted by {e.signal_name}" if isinstance(e, Interrupted) else "interrupted"
