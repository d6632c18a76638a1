"""Local commands the testbed runs on this machine (debootstrap, pip, mount, ssh-keygen, nsenter): with a
deadline, progress reports for the long ones, and the tail of their output in the error when they fail."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from ..errors import TestbedError

# A long local step (debootstrap, pip) reports its elapsed time and last log line this often.
PROGRESS_EVERY_S = 15.0

Log = Callable[[str], None]


def quiet(_: str) -> None:
    pass


def last_log_line(path: Path, limit: int = 8192) -> str:
    """The last non-empty line of a log file (read from its end only), for progress reports."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - limit))
            tail = f.read().decode(errors="replace")
    except OSError:
        return ""
    lines = [line.strip() for line in tail.replace("\r", "\n").splitlines() if line.strip()]
    return lines[-1] if lines else ""


def run(
    argv: list[str],
    *,
    log_file: Path | None = None,
    timeout: float | None = None,
    what: str = "",
    progress: Log | None = None,
    every_s: float = PROGRESS_EVERY_S,
) -> None:
    """Run a local command; on failure raise TestbedError with the tail of its output. With ``progress`` and a
    ``log_file``, every ``every_s`` seconds it reports the elapsed time and the log's last line."""
    out = open(log_file, "ab") if log_file else subprocess.DEVNULL
    try:
        if log_file:
            out.write(f"\n$ {' '.join(argv)}\n".encode())
            out.flush()
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT if log_file else subprocess.PIPE,
        )
        start = time.monotonic()
        next_report = start + every_s
        while True:
            try:
                _, stderr = proc.communicate(timeout=max(0.05, min(next_report - time.monotonic(), 1.0)))
                break
            except subprocess.TimeoutExpired:
                now = time.monotonic()
                if timeout is not None and now - start > timeout:
                    proc.kill()
                    proc.communicate()
                    raise TestbedError(f"{what or argv[0]} did not finish within {timeout:g}s") from None
                if progress is not None and log_file is not None and now >= next_report:
                    progress(f"  {what or argv[0]}: {now - start:.0f}s, last: {last_log_line(log_file)[:160]}")
                    next_report = now + every_s
    finally:
        if log_file:
            out.close()
    if proc.returncode != 0:
        if log_file:
            tail = "\n".join(log_file.read_text(errors="replace").splitlines()[-15:])
            raise TestbedError(f"{what or argv[0]} failed (exit {proc.returncode}); see {log_file}:\n{tail}")
        err = (stderr or b"").decode(errors="replace").strip()
        raise TestbedError(f"{what or argv[0]} failed (exit {proc.returncode}): {err[-2000:]}")
