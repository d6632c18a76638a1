"""journalctl queries, as text."""

from __future__ import annotations

import shlex

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
    assert since.endswith(" | grep --line-buffered -F '[kdtree]'")


def test_latest_parity_lines_of_one_invocation() -> None:
    cmd = hj.latest_parity_lines_command("abc'def", 64)
    assert f"_SYSTEMD_INVOCATION_ID={shlex.quote(chr(97) + 'bc' + chr(39) + 'def')}" in cmd
    assert cmd.endswith("| grep -F '[kdtree] L' | tail -n 64")
