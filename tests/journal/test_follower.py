import json

from kdtree_backend.wire import LEFT_OUT

from opsctl.journal.follower import Follower
from opsctl.journal.query import SEPARATOR, Mark, message_text, parse_mark, parse_unit_show

SHOW = "ActiveState=active\nSubState=running\nNRestarts=0\nInvocationID=new1\nResult=success\n"


def entry(cursor: str, msg: object, inv: str) -> str:
    return json.dumps({"__CURSOR": cursor, "MESSAGE": msg, "_SYSTEMD_INVOCATION_ID": inv, "__REALTIME_TIMESTAMP": "1"})


def poll(*entries: str) -> str:
    return SHOW + SEPARATOR + "\n" + "\n".join(entries) + "\n"


def test_only_new_invocation_and_no_duplicates() -> None:
    f = Follower(unit="u", mark=Mark(old_invocation="old", cursor="c0"))
    assert "--after-cursor=c0" in f.poll_command()
    obs, got = f.ingest(poll(entry("c1", "old last words", "old"), entry("c2", "[kdtree] L1 rel=0", "new1")))
    assert obs.invocation_id == "new1" and [e.cursor for e in got] == ["c2"]
    assert f.cursor == "c2" and "--after-cursor=c2" in f.poll_command()
    # A resent overlap (e.g. after a reconnect) is not handed out twice.
    _, got2 = f.ingest(poll(entry("c2", "[kdtree] L1 rel=0", "new1"), entry("c3", "x", "new2")))
    assert [e.cursor for e in got2] == ["c3"]
    assert f.invocations == ["new1", "new2"]


def test_truncated_json_line_does_not_advance() -> None:
    f = Follower(unit="u", mark=Mark(old_invocation="old", cursor=None))
    assert "--after-cursor" not in f.poll_command()
    _, got = f.ingest(poll(entry("c1", "a", "n"), entry("c2", "b", "n")[:20]))
    assert [e.cursor for e in got] == ["c1"] and f.cursor == "c1"


def test_binary_message() -> None:
    assert message_text([104, 105]) == "hi"
    # A null MESSAGE (journalctl left it out) is never "" (skipped): it is handed on for the gate to fail.
    assert message_text(None).startswith(LEFT_OUT) and message_text({"x": 1}).startswith(LEFT_OUT)


def test_parse_mark_and_show() -> None:
    m = parse_mark("inv0\n" + json.dumps({"__CURSOR": "s=1;i=2"}) + "\n")
    assert m.old_invocation == "inv0" and m.cursor == "s=1;i=2"
    assert parse_mark("\n").cursor is None
    obs = parse_unit_show("ActiveState=failed\nSubState=failed\nNRestarts=5\nInvocationID=\nResult=exit-code\n")
    assert obs.active_state == "failed" and obs.n_restarts == 5 and obs.result == "exit-code"


def test_an_entry_with_a_line_separator_inside_stays_whole() -> None:
    """journalctl -o json prints U+2028/U+2029 raw inside a string: the follower must not cut the entry there (it
    used to drop it, so a failing parity line with one in it was never judged)."""
    msg = "[kdtree] L0 max_abs_diff=0 mean=0 rel=0 tp=0 token=0123456789abcdef\u2028rel=0.9"
    raw = json.dumps(
        {"__CURSOR": "c1", "MESSAGE": msg, "_SYSTEMD_INVOCATION_ID": "new1", "__REALTIME_TIMESTAMP": "1"},
        ensure_ascii=False,
    )
    f = Follower(unit="u", mark=Mark(old_invocation="old", cursor=None))
    _, got = f.ingest(poll(raw, entry("c2", "next\u2029", "new1")))
    assert [e.message for e in got] == [msg, "next\u2029"]
