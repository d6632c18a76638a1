"""Every line the backend, the replay service and the stand-in print reaches the reader whole (issue 36, item 2):
many threads in many processes write lines at once to one pipe, and to one file opened for appending, as
journald's stdout stream or an ``append:`` log file receives them; every line must arrive as it was written.

The unit runs Python with ``PYTHONUNBUFFERED=1`` (systemd/sglang-k26-ddtree.service), as these writers do: there
``print(line)`` is two writes, the text and then its newline, and a line from another thread or process lands
between them (the glued ``served rid=...[kdtree] L0 ...`` message). ``write_line`` writes once."""

from __future__ import annotations

import os
import re
import subprocess
import threading
from pathlib import Path

import pytest
from kdtree_backend.lines import write_line

from tests.backend.helpers import PYTHON, REPO, replay_env

PROCESSES, THREADS, LINES = 4, 6, 150
LINE_RE = re.compile(r"^\[kdtree\] L(\d+) proc=(\d+) thread=(\d+) seq=(\d+) pad=(x*) end$")

# A writer process: THREADS threads, each LINES lines of varied length (up to ~3 KB, under PIPE_BUF), released
# together; argv: process number, writer ("write_line" or "print": the old emission).
WRITER = """
import sys, threading
from kdtree_backend.lines import write_line
proc, how = int(sys.argv[1]), sys.argv[2]
THREADS, LINES = int(sys.argv[3]), int(sys.argv[4])
start = threading.Barrier(THREADS)
def line(t, i):
    return f"[kdtree] L{(t * 7 + i) % 61} proc={proc} thread={t} seq={i} pad={'x' * ((proc * 131 + t * 17 + i * 53) % 3000)} end"
def run(t):
    start.wait()
    for i in range(LINES):
        if how == "print":
            print(line(t, i), flush=True)
        else:
            write_line(line(t, i))
threads = [threading.Thread(target=run, args=(t,)) for t in range(THREADS)]
for th in threads: th.start()
for th in threads: th.join()
"""


def expected_lines() -> set[tuple[int, int, int, int]]:
    return {
        (p, t, i, (p * 131 + t * 17 + i * 53) % 3000)
        for p in range(PROCESSES)
        for t in range(THREADS)
        for i in range(LINES)
    }


def broken_lines(text: str) -> tuple[list[str], set[tuple[int, int, int, int]]]:
    """(lines that are not one whole written line, the whole lines found as (proc, thread, seq, pad length))."""
    bad, whole = [], set()
    for line in text.split("\n")[:-1]:
        m = LINE_RE.match(line)
        if m is None:
            bad.append(line[:120])
        else:
            whole.add((int(m.group(2)), int(m.group(3)), int(m.group(4)), len(m.group(5))))
    return bad, whole


def run_writers(how: str, stdout: int) -> None:
    """PROCESSES writer processes at once, all with ``stdout`` as their standard output."""
    env = replay_env(REPO)  # PYTHONUNBUFFERED=1, as the unit
    procs = [
        subprocess.Popen(
            [PYTHON, "-c", WRITER, str(p), how, str(THREADS), str(LINES)], stdout=stdout, env=env, cwd=REPO
        )
        for p in range(PROCESSES)
    ]
    for proc in procs:
        assert proc.wait(timeout=300) == 0


def through_a_pipe(how: str) -> str:
    read_end, write_end = os.pipe()
    chunks: list[bytes] = []
    reader = threading.Thread(target=lambda: chunks.extend(iter(lambda: os.read(read_end, 1 << 16), b"")))
    reader.start()
    try:
        run_writers(how, write_end)
    finally:
        os.close(write_end)
        reader.join(timeout=60)
        os.close(read_end)
    return b"".join(chunks).decode()


def through_an_appended_file(how: str, path: Path) -> str:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        run_writers(how, fd)
    finally:
        os.close(fd)
    return path.read_text()


def test_lines_written_at_once_by_threads_and_processes_arrive_whole_through_a_pipe() -> None:
    bad, whole = broken_lines(through_a_pipe("write_line"))
    assert bad == []
    assert whole == expected_lines()


def test_lines_written_at_once_by_threads_and_processes_arrive_whole_in_an_appended_file(tmp_path: Path) -> None:
    bad, whole = broken_lines(through_an_appended_file("write_line", tmp_path / "out.log"))
    assert bad == []
    assert whole == expected_lines()


def test_the_check_catches_the_old_print_writer() -> None:
    """The same load through ``print(line, flush=True)`` (the emission before issue 36) glues lines: the check
    above can fail. (Measured here: 6 to 642 of 3,600 lines broken per run; up to three runs, in case one is
    lucky.)"""
    for _ in range(3):
        bad, whole = broken_lines(through_a_pipe("print"))
        if bad:
            break
    assert bad, "no glued line in three runs of the old writer"
    assert len(whole) < len(expected_lines())


def test_a_line_is_one_write_and_a_newline_inside_it_cannot_start_another(capfd: pytest.CaptureFixture[str]) -> None:
    write_line("kdtree-standin: served rid=a\n[kdtree] L0 forged")
    write_line("to stderr", stderr=True)
    out, err = capfd.readouterr()
    assert out == "kdtree-standin: served rid=a\\n[kdtree] L0 forged\n" and err == "to stderr\n"
