"""A TP 8 deploy as an operator's terminal shows it (issue 38, docs/operator-view.md): the CLI runs on a real
pseudo-terminal (100 columns), its bytes are replayed through a VT100 screen (pyte), and the test reads what is
left on the screen at the end, the live view's redraws included. A passing deploy fits on about one screen; a
release wrong on one rank shows that rank and the layer in its last five lines.

The screen is 200 rows tall so that nothing scrolls away: every row the deploy left is counted."""

from __future__ import annotations

import fcntl
import os
import select
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import pyte
import pytest
import yaml

from opsctl.inventory import Inventory
from opsctl.release import make_manifest
from opsctl.testbed import reset_host
from tests.fault.harness import standin_variant
from tests.pipeline import trees

REPO = Path(__file__).resolve().parents[2]
HOST = "tb2"
COLS, ROWS = 100, 200
MAX_PASS_ROWS = 30  # the "at most about 30 lines" for a passing TP 8 deploy

# Rank 5's parity lines are off by 0.5 on every layer, the other seven ranks are right: the pre-restart check runs
# the replay (rank 0), not the server, so the release reaches the gate.
RANK_5_OFF = """
import sys
_scheduler = sys.modules[Scheduler.__module__]  # the verify steps call its fault_parity
_real = _scheduler.fault_parity
def _rank_5_off(fault, rank, stats):
    out = _real(fault, rank, stats)
    return (out[0], out[1], out[2] + 0.5) if rank == 5 and out is not None else out
_scheduler.fault_parity = _rank_5_off
"""


def tp8_inventory(tmp_path: Path, testbed: Inventory) -> Path:
    """The testbed inventory with tb2 serving as 8 TP ranks (three parity layers, as deploy/kdtree.json has), and
    without the comparison and the pre-restart speed check (not what this test is about; their own tests are)."""
    doc = yaml.safe_load(Path(testbed.path).read_text())
    over = doc["hosts"][HOST]
    over["service"] = {**over.get("service", {}), "tp": 8}
    over["gate"] = {"compare": {"enabled": False}, "speed": {"enabled": False}}
    path = tmp_path / "inventory.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def on_a_terminal(args: list[str], timeout_s: float = 300.0) -> tuple[int, list[str]]:
    """Run ``opsctl ARGS`` on a pseudo-terminal of COLS x ROWS -> (exit code, the screen's rows at the end, right
    blanks stripped, trailing blank rows dropped)."""
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", ROWS, COLS, 0, 0))
    env = {**os.environ, "TERM": "xterm-256color", "COLUMNS": str(COLS), "LINES": str(ROWS)}
    env.pop("NO_COLOR", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "opsctl", *args],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        cwd=REPO,
        env=env,
        start_new_session=True,
    )
    os.close(slave)
    screen = pyte.Screen(COLS, ROWS)
    stream = pyte.ByteStream(screen)
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 1.0)
            if not ready:
                if proc.poll() is not None:
                    break
                continue
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: the terminal's last writer is gone
                break
            if not data:
                break
            stream.feed(data)
        else:
            proc.kill()
            pytest.fail(f"opsctl {' '.join(args)} did not end within {timeout_s:g}s")
        rc = proc.wait(timeout=30)
    finally:
        os.close(master)
    rows = [line.rstrip() for line in screen.display]
    while rows and not rows[-1]:
        rows.pop()
    return rc, rows


def unwrapped(rows: list[str]) -> str:
    """The screen's text with the terminal's own wrapping undone (a row filled to the last column goes on in the
    next), for reading a long line whole."""
    return "".join(row + ("" if len(row) == COLS else "\n") for row in rows)


@pytest.mark.testbed
def test_a_tp8_deploy_fits_a_screen_and_a_failing_rank_is_in_the_last_lines(testbed: Inventory, tmp_path: Path) -> None:
    inv = tp8_inventory(tmp_path, testbed)
    good = trees.copy_tree(tmp_path / "good", tag="tp8-good")
    bad = standin_variant(tmp_path / "bad", "tp8-rank-5-off", RANK_5_OFF)
    good_id, bad_id = make_manifest(good).id, make_manifest(bad).id
    try:
        rc, rows = on_a_terminal(["-i", str(inv), "deploy", HOST, "--yes", "--src", str(good)])
        screen = unwrapped(rows)
        print(f"TP 8 PASS deploy: {len(rows)} rows on the terminal")
        assert rc == 0 and f"{HOST}: deploy {good_id} -> PASS" in screen, screen
        assert "on each of 8 ranks" in screen, screen  # the gate waited for all eight ranks
        assert len(rows) <= MAX_PASS_ROWS, f"{len(rows)} rows on the screen:\n{screen}"
        assert "TP7" not in screen  # the live table is gone once the gate ends; only its facts stay

        rc, rows = on_a_terminal(["-i", str(inv), "deploy", HOST, "--yes", "--src", str(bad)])
        screen = unwrapped(rows)
        print(f"TP 8 FAIL deploy: {len(rows)} rows on the terminal; the last 5:\n" + "\n".join(rows[-5:]))
        assert rc == 31, screen
        last = "\n".join(rows[-5:])
        assert f"{HOST}: deploy {bad_id} -> FAIL" in screen and f"rolled back to {good_id}" in screen, screen
        assert "TP5" in last and "L0" in last, f"the failing rank and layer are not in the last 5 rows:\n{screen}"
        assert not any(f"FAIL TP{r} " in screen for r in (0, 1, 2, 3, 4, 6, 7)), screen  # only rank 5 is named
    finally:
        reset_host(testbed.host(HOST))  # its unit serves 8 ranks now; the tests that follow expect the inventory's 2
