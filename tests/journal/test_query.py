"""journalctl queries, as text."""

from __future__ import annotations

import json
import shlex
import subprocess

from kdtree_backend.wire import LEFT_OUT

from opsctl.health import probe_on_host
from opsctl.journal import query as hj


def test_poll_resumes_after_the_cursor_quoted() -> None:
    cursor = "s=abc;i=1;b=x'y"
    cmd = hj.poll_command("u", cursor)
    assert f"--after-cursor={shlex.quote(cursor)}" in cmd
    assert cmd.startswith("systemctl show -p ActiveState,SubState,NRestarts,InvocationID,Result u.service; ")
    assert f"echo {shlex.quote(hj.SEPARATOR)};" in cmd and "_SYSTEMD_UNIT=u.service" in cmd
    assert "--after-cursor" not in hj.poll_command("u", None)


def test_mark_reads_invocation_then_last_cursor() -> None:
    cmd = hj.mark_command("my unit")
    assert cmd.startswith(f"systemctl show -p InvocationID --value {shlex.quote('my unit.service')}; journalctl -n 1")


def test_logs_command() -> None:
    tail = hj.logs_command("u", since=None, lines=50, follow=False, kdtree_only=False)
    assert shlex.split(tail)[-3:] == ["-q", "-n", "50"]
    since = hj.logs_command("u", since="1 hour ago", lines=50, follow=True, kdtree_only=True)
    words = shlex.split(since)
    assert words[words.index("--since") + 1] == "1 hour ago" and "-n" not in words and "-f" in words
    assert since.endswith(" | grep --line-buffered -E " + shlex.quote(r'\[kdtree\]|"MESSAGE" ?: ?(\[|null)'))


def test_every_journal_read_passes_all() -> None:
    """Without --all journalctl prints a MESSAGE of 4096 bytes or more as null (JSON) and a message with a control
    character as [N blob data] (text): a padded or garbled failing parity line was dropped and the release passed."""
    commands = [
        hj.mark_command("u"),
        hj.poll_command("u", None),
        hj.poll_command("u", "s=1"),
        hj.logs_command("u", since=None, lines=5, follow=False, kdtree_only=False),
        hj.logs_command("u", since="1 hour ago", lines=5, follow=True, kdtree_only=True),
        hj.latest_parity_lines_command("abc"),
    ]
    for cmd in commands:
        for part in cmd.split("|"):
            if "journalctl" in part:
                assert "--all" in shlex.split(part.split(";")[-1]), part
    assert "--all" in probe_on_host.journal_argv("u.service", "inv", 60)


def test_kdtree_only_keeps_entries_whose_message_grep_cannot_read() -> None:
    """A byte-array MESSAGE (not printable UTF-8) holds the marker as numbers, a null one not at all: grep keeps both
    for the reader to decode and judge (run through grep itself)."""
    cmd = hj.logs_command("u", since=None, lines=5, follow=False, kdtree_only=True)
    pattern = shlex.split(cmd.split(" | ", 1)[1])[-1]
    entries = [
        json.dumps({"MESSAGE": "[kdtree] L0 rel=1"}),
        '{ "MESSAGE" : [ 91, 107, 100 ] }',
        json.dumps({"MESSAGE": list(b"[kdtree] L0 \x1b")}),
        json.dumps({"MESSAGE": None}),
        json.dumps({"MESSAGE": "INFO serving"}),
    ]
    kept = subprocess.run(["grep", "-E", pattern], input="\n".join(entries) + "\n", capture_output=True, text=True)
    assert kept.stdout.split("\n")[:-1] == entries[:4]


def test_the_health_probe_keeps_a_null_message_as_the_wire_s_left_out_text() -> None:
    assert probe_on_host.LEFT_OUT == LEFT_OUT
    out = "\n".join([json.dumps({"MESSAGE": None}), json.dumps({"MESSAGE": list(b"[kdtree] L1")}), "{cut"])
    lines = probe_on_host.parity_lines(out, "[kdtree]", 10)
    assert lines[0][1].startswith(LEFT_OUT) and lines[1][1] == "[kdtree] L1"


def test_a_null_message_in_a_poll_is_an_entry_the_gate_fails() -> None:
    from opsctl.gate.decision import GateState, LineVerdict, judge
    from opsctl.inventory import GateSettings

    body = "\n".join([json.dumps({"__CURSOR": "c1", "MESSAGE": None}), json.dumps({"__CURSOR": "c2"})])
    _, entries = hj.parse_poll("ActiveState=active\n" + hj.SEPARATOR + "\n" + body)
    assert [e.message[: len(LEFT_OUT)] for e in entries] == [LEFT_OUT, ""]  # no MESSAGE field at all: ""
    gate = GateState.every_line(GateSettings(), expected_ranks=1, token="0123456789abcdef")
    j = judge(gate, entries[0].message, 0.0)
    assert j is not None and j.verdict is LineVerdict.FAIL


def test_latest_parity_lines_of_one_invocation() -> None:
    cmd = hj.latest_parity_lines_command("abc'def", 64)
    assert f"_SYSTEMD_INVOCATION_ID={shlex.quote(chr(97) + 'bc' + chr(39) + 'def')}" in cmd
    assert cmd.endswith("| grep -F '[kdtree] L' | tail -n 64")
