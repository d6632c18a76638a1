"""`opsctl status` tells one story (issue 38): the verdict and restart lines from one record or said to be from an
earlier one; `bad:` only releases still on the host, with a count of removed ones; a malformed line shows its
reason; the exit code a cron can act on. Pure: no host."""

from __future__ import annotations

import io
import json

import pytest
from rich.console import Console

from opsctl.cli import status as cli_status
from opsctl.host import views
from opsctl.host.history import DeployVerdict, HistoryEvent, parse_history
from opsctl.host.releaseroot import parse_snapshot
from tests import builders

TOKEN = "0123456789abcdef0123456789abcdef"
PROBED = {"elapsed_s": 4.0, "probe": {"ready_after_s": 3.0, "verdict_after_ready_s": 1.0}}


def history(*docs: dict[str, object]) -> list:
    return parse_history("\n".join(json.dumps(d) for d in docs))


def test_verdict_and_restart_from_the_same_record() -> None:
    told = cli_status.story(
        history(
            {"event": "deploy", "release": "r1", "verdict": "PASS", "at": "t1", "gate": PROBED},
            {"event": "deploy", "release": "r2", "verdict": "FAIL", "at": "t2", "gate": PROBED},
        )
    )
    assert told.last is not None and told.last.release == "r2" and told.times is not None
    assert told.times.release == "r2" and told.times.verdict is DeployVerdict.FAIL
    assert told.earlier_times is None


def test_an_unproven_rollback_does_not_borrow_an_older_restarts_pass() -> None:
    """The issue's case: the newest verdict is UNPROVEN (its gate did not probe); the restart times shown are an
    older record's, and said to be."""
    told = cli_status.story(
        history(
            {"event": "deploy", "release": "r1", "verdict": "PASS", "at": "t1", "gate": PROBED},
            {"event": "rollback", "release": "r1", "verdict": "UNPROVEN", "at": "t2", "gate": {"elapsed_s": 60}},
        )
    )
    assert told.last is not None and told.last.verdict is DeployVerdict.UNPROVEN
    assert told.times is None
    assert told.earlier_times is not None and told.earlier_times.event is HistoryEvent.DEPLOY


def _snapshot(active: str = "active", releases: tuple[str, ...] = (), bad: tuple[str, ...] = ()):
    lines = ["root_exists=1", f"unit.ActiveState={active}", "unit.LoadState=loaded", "managed={}"]
    lines += [f"release={i} {rid}" for i, rid in enumerate(releases, 1)]
    lines += [f"bad={b} {{}}" for b in bad]
    return parse_snapshot("\n".join(lines) + "\n")


def test_bad_lists_only_releases_still_on_the_host() -> None:
    on_host = ("r000000000001", "r000000000002")
    snap = _snapshot(releases=on_host, bad=("r000000000002", "r000000000009", "r00000000000a"))
    assert set(snap.releases) == set(on_host) and len(snap.bad) == 3  # the snapshot read them as the host said
    assert cli_status.bad_releases(snap) == (["r000000000002"], 2)
    assert cli_status.bad_releases(_snapshot(releases=on_host)) == ([], 0)


@pytest.mark.parametrize(
    ("docs", "code"),
    [
        ([{"unit": {"active": "active"}, "parity_fail_lines": 0}], 0),
        ([{"unit": {"active": "active"}, "parity_fail_lines": 2}], 31),
        ([{"unit": {"active": "failed"}, "parity_fail_lines": 0}], 3),
        ([{"unit": {"active": "inactive"}, "parity_fail_lines": 1}], 31),
        ([{"unit": {"active": "active"}, "parity_fail_lines": 0}, {"host": "b", "error": "unreachable"}], 10),
    ],
)
def test_exit_code(docs: list[dict[str, object]], code: int) -> None:
    assert cli_status.exit_code(docs) == code


def _line(rel: str = "1.0e-03", rank: int = 0, layer: int = 30, extra: str = "") -> str:
    return f"[kdtree] L{layer} max_abs_diff=1.0e-03 mean=1.0e-04 rel={rel} tp={rank}{extra} token={TOKEN}"


@pytest.mark.parametrize(
    ("active", "messages", "code", "shown"),
    [
        ("active", [_line(rank=0), _line(rank=1)], 0, None),
        ("active", [_line("9.0e-01", rank=1), _line(rank=1)], 31, "TP1 L30 rel=0.9"),  # an older FAIL counts
        ("failed", [_line(rank=0), _line(rank=1)], 3, "not active"),
        ("active", ["[kdtree] L30 max_abs_diff=1 rel=0.001 tp=0" + f" token={TOKEN}"], 31, "malformed"),
    ],
)
def test_status_exits_as_its_story(
    monkeypatch: pytest.MonkeyPatch, active: str, messages: list[str], code: int, shown: str | None
) -> None:
    h = builders.host("h", gpu_arch=None, service={"tp": 2})
    view = views.StatusView(_snapshot(active), [], messages, TOKEN)
    monkeypatch.setattr(views, "read_status", lambda _h: view)
    buf = io.StringIO()
    monkeypatch.setattr(cli_status, "console", Console(file=buf, width=200, color_system=None))
    doc = cli_status._status_one(h, as_json=False)
    assert cli_status.exit_code([doc]) == code
    text = buf.getvalue()
    if shown is not None:
        assert shown in text, text
    assert "L-1" not in text and " nan" not in text
