"""Text from a host, a journal or a sample never reaches the terminal raw (issue 47 item 11): ESC with CSI and OSC
sequences, a C1 control, a bidi override and a line separator fed through each view come out escaped
(``opsctl.terminal.escaped``, the one helper), offline commands as a user runs them, live views through their
pure renderers."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console

from opsctl.cli import common as cli_common
from opsctl.cli import logs as cli_logs
from opsctl.cli import releases as cli_releases
from opsctl.cli import render as cli_render
from opsctl.cli import status as cli_status
from opsctl.cli.common import EscapingConsole
from opsctl.cli.progress import RichReporter
from opsctl.errors import DeployFailed
from opsctl.gate.decision import LineVerdict
from opsctl.gate.lines import ParityLine, parse_line
from opsctl.health.levels import CheckResult, HostHealth, Level
from opsctl.host import views
from opsctl.host.releaseroot import parse_snapshot
from opsctl.lock.hostlock import describe_owner, json_object_or_none
from opsctl.terminal import escaped
from tests import builders
from tests.cli.test_cli_verdicts import journal
from tests.comparison.test_compare import side, with_requests

TOKEN = "0123456789abcdef0123456789abcdef"
J = "2026-05-31T13:04:12+0000 ct200 python[22251]: "
# ESC with an OSC (window title) and a CSI (clear the screen), a C1 CSI, a bidi override, a line separator.
HOSTILE = ("\x1b]0;pwned\x07\x1b[2J", "\x9b2J", "\u202e", "\u2028")
RAW = set("\x1b\x07\x9b\u202e\u2028")
ESCAPED = ("\\x1b]0;pwned\\x07\\x1b[2J", "\\x9b2J", "\\u202e", "\\u2028")


def clean(text: str) -> bool:
    """No character of the hostile ones, nor any other that is not printable (but the lines' own breaks)."""
    return not any(not (c.isprintable() or c in "\n") for c in text)


def assert_escaped(text: str, *, every: bool = True) -> None:
    assert clean(text), [c for c in text if not (c.isprintable() or c == "\n")][:5]
    if every:
        for form in ESCAPED:
            assert form in text, (form, text[-2000:])


# ------------------------------------------------------------------------------------------------- the helper


def test_the_helper_escapes_each_kind_and_leaves_printable_text_alone() -> None:
    assert escaped("rel=1.0e-03 TP0 é…中") == "rel=1.0e-03 TP0 é…中"
    assert [escaped(h) for h in HOSTILE] == list(ESCAPED)
    assert escaped("a\u2066b\u2069\x00\x7f\n\t\udcff") == "a\\u2066b\\u2069\\x00\\x7f\\n\\t\\udcff"
    assert escaped("one\ntwo\x1b", keep="\n") == "one\ntwo\\x1b"


@settings(max_examples=300, deadline=None)
@given(st.text(), st.sampled_from(["", "\n", "\n\t"]))
def test_the_helper_never_lets_a_non_printable_through(text: str, keep: str) -> None:
    out = escaped(text, keep=keep)
    assert all(c.isprintable() or c in keep for c in out)
    if text.isprintable():
        assert out == text
    # Only ever adds: every printable character of the input is still there, in order.
    printable = [c for c in text if c.isprintable()]
    it = iter(out)
    assert all(c in it for c in printable)


# ----------------------------------------------------------------------------------- offline: as a user runs it


def _opsctl(*args: str | Path, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "opsctl", *map(str, args)],
        capture_output=True,
        text=True,
        input=stdin,
        env={**os.environ, "OPSCTL_INVENTORY": "/nonexistent/inventory.yaml", "COLUMNS": "200"},
        check=False,
        timeout=120,
    )


def _hostile_journal(tmp_path: Path) -> Path:
    lines = []
    for h in HOSTILE:
        lines.append(f"{J}[kdtree] L0 max_abs_diff=1.0e-03 mean=1.0e-04 rel=1.0e-03{h} tp=0 token={TOKEN}")
        lines.append(f"{J}[kdtree] L0 max_abs_diff=1.0e-03 mean=1.0e-04 rel=1.0e-03 tp=0 token=zz{h}")
    path = tmp_path / "journal.txt"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_parity_check_shows_every_line_and_invocation_escaped(tmp_path: Path) -> None:
    src = _hostile_journal(tmp_path)
    env = tmp_path / "parity.env"
    env.write_text(f"KDTREE_PARITY_TOKEN={TOKEN}\n")
    r = _opsctl("parity", "check", src, "--tp", "1", "--token-file", env)
    assert r.returncode == 31, r.stderr
    assert_escaped(r.stdout + r.stderr, every=False)
    assert "rel=1.0e-03\\x1b]0;pwned\\x07\\x1b[2J" in r.stdout
    every = _opsctl("parity", "check", src, "--all")  # each invocation with its (wrong) token
    assert every.returncode == 31 and "token zz\\x1b]0;pwned" in every.stdout
    assert_escaped(every.stdout + every.stderr)
    as_json = _opsctl("parity", "check", src, "--all", "--json")
    assert clean(as_json.stdout) and not RAW & set(as_json.stdout)
    json.loads(as_json.stdout)


def test_compare_shows_a_samples_error_text_escaped(tmp_path: Path) -> None:
    old = tmp_path / "old.json"
    new = tmp_path / "new.json"
    old.write_text(json.dumps(side().to_json()))
    broken = {i: {"status": 400, "error": f"bad {HOSTILE[i]} request", "output_ids": ()} for i in range(4)}
    new.write_text(json.dumps(with_requests(side(), broken).to_json()))
    r = _opsctl("compare", old, new)
    assert r.returncode == 31, r.stdout + r.stderr
    assert "HTTP 400: bad \\x1b]0;pwned" in r.stdout
    assert_escaped(r.stdout + r.stderr, every=False)


def test_an_error_message_quoting_a_host_is_escaped(monkeypatch: pytest.MonkeyPatch) -> None:
    buf = io.StringIO()
    monkeypatch.setattr(cli_common, "err", EscapingConsole(file=buf, width=300))
    cli_common.report_error(DeployFailed("h1: the host said " + "".join(HOSTILE)))
    assert_escaped(buf.getvalue())


def test_the_console_itself_escapes_what_a_view_forgot() -> None:
    buf = io.StringIO()
    console = EscapingConsole(file=buf, width=300, force_terminal=True, color_system="standard", highlight=False)
    console.print("[red]x[/] " + "".join(HOSTILE) + "\nnext line")
    text = buf.getvalue()
    assert "\\x1b]0;pwned" in text and "\\u202e" in text and "\\u2028" in text and "\nnext line" in text
    assert "\x1b[31m" in text  # rich's own colour sequences still go out
    assert not set("\x07\x9b\u202e\u2028") & set(text)


# ----------------------------------------------------------------------------------------------- live views


def _ignored_line(h: str) -> ParityLine:
    rec = parse_line(f"[kdtree] L0 max_abs_diff=1.0e-03 mean=1.0e-04 rel=1.0e-03{h} tp=0 token={TOKEN}")
    assert isinstance(rec, ParityLine)
    return rec


@pytest.mark.parametrize("live", [False, True])
def test_the_deploys_view_escapes_ignored_lines_details_and_the_verdict(live: bool) -> None:
    buf = io.StringIO()
    console = EscapingConsole(file=buf, width=100, force_terminal=live, color_system=None)
    rep = RichReporter("h", console, release="r1", plain=not live, verbose=True)
    with rep:
        rep.step("gate")
        for h in HOSTILE:
            rep.info(f"ignored parity line L?: wrong token= {h}")
            rep.parity(_ignored_line(h), LineVerdict.FAIL)
        rep.done("gate", "FAIL: " + "".join(HOSTILE))
    # The live display's own cursor moves (hide, erase the line, up one) are rich's, not the host's.
    assert_escaped(re.sub(r"\x1b\[(\?25[lh]|2K|\d*A)|\r", "", buf.getvalue()))


def test_plain_output_past_rich_is_escaped_too() -> None:
    buf = io.StringIO()
    rep = RichReporter("h", Console(file=buf, width=80), release="r1", plain=True)
    for h in HOSTILE:
        rep.info(f"ignored line: [kdtree] inside another message {h}")
    assert_escaped(buf.getvalue())


@pytest.mark.parametrize("mode", ["table", "follow", "piped", "raw"])
def test_logs_show_journal_messages_escaped(mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    buf = io.StringIO()
    console = EscapingConsole(file=buf, width=300, color_system=None, force_terminal=mode != "piped")
    monkeypatch.setattr(cli_logs, "console", console)
    h = builders.host(service={"tp": 1})
    printer = cli_logs._LogPrinter(h, as_json=False, stream=mode == "follow", raw=mode == "raw", token=TOKEN)
    matcher = cli_logs._matcher(None)
    for x in HOSTILE:
        printer.feed(journal(f"INFO: a message {x}"), matcher)
        printer.feed(
            journal(f"[kdtree] L0 max_abs_diff=1.0e-03 mean=1.0e-04 rel=1.0e-03{x} tp=0 token={TOKEN}"), matcher
        )
        printer.feed(journal(f"INFO: a request [kdtree] L0 rel=0 tp=0 {x}"), matcher)
    printer.flush()
    assert_escaped(buf.getvalue(), every=mode != "table")  # the table shows why a line is malformed, not its text


def test_status_shows_the_hosts_words_and_the_lock_owner_escaped(monkeypatch: pytest.MonkeyPatch) -> None:
    owner = json.dumps({"user": f"u{HOSTILE[0]}", "client": f"c{HOSTILE[1]}", "command": HOSTILE[2] + HOSTILE[3]})
    snap = parse_snapshot(f"root_exists=1\nunit_active=act{HOSTILE[0]}\nlock_present=1\nlock={owner}\n")
    messages = [f"[kdtree] L0 max_abs_diff=1.0e-03 mean=1.0e-04 rel=1.0e-03{h} tp=0 token={TOKEN}" for h in HOSTILE]
    monkeypatch.setattr(views, "read_status", lambda _h: views.StatusView(snap, [], messages, TOKEN))
    buf = io.StringIO()
    monkeypatch.setattr(cli_status, "console", EscapingConsole(file=buf, width=400, color_system=None))
    cli_status._status_one(builders.host(service={"tp": 1}), as_json=False)
    assert_escaped(buf.getvalue())


def test_releases_show_the_hosts_metadata_escaped(monkeypatch: pytest.MonkeyPatch) -> None:
    rid = "r0123456789ab"
    snap = parse_snapshot(f"root_exists=1\nrelease=1 {rid}\n")
    meta = {rid: {"created_at": "".join(HOSTILE), "commit": "c" + HOSTILE[0]}}
    monkeypatch.setattr(views, "read_releases", lambda _h: SimpleNamespace(snap=snap, history=[], meta=meta))
    monkeypatch.setattr(cli_common, "host_of", lambda *_a: builders.host())
    buf = io.StringIO()
    monkeypatch.setattr(cli_common, "out", EscapingConsole(file=buf, width=400, color_system=None))
    cli_releases.releases_command("h1")
    assert_escaped(buf.getvalue().replace("…", ""), every=False)
    assert "\\x1b]0;pwned" in buf.getvalue() and "\\u202e" in buf.getvalue()


def test_health_shows_each_checks_detail_escaped() -> None:
    checks = tuple(CheckResult(name, Level.CRIT, f"{name} said {''.join(HOSTILE)}") for name in ("unit", "parity"))
    result = HostHealth("h1", checks, 0.0, 0.1)
    lines = cli_render.details([result])
    assert_escaped("\n".join(lines))
    buf = io.StringIO()
    Console(file=buf, width=400, color_system=None).print(cli_render.render_table([result]))
    assert clean(buf.getvalue())


def test_a_lock_owner_is_shown_escaped_and_an_unreadable_one_never_printed() -> None:
    owner = {"user": HOSTILE[0], "client": HOSTILE[1], "pid": 7, "since": HOSTILE[2], "command": HOSTILE[3]}
    assert_escaped(describe_owner(owner))
    secret = "NONCE-a1b2c3d4e5f6"
    for text in (f'{{"token": "{secret}", "user": ', f'["{secret}"]', "9" * 5000, "[" * 10_000):
        said = describe_owner(json_object_or_none(text))
        assert secret not in said and "9999" not in said and said.startswith("an unreadable owner record (")
        assert f"{len(text):,} characters" in said
