"""`opsctl parity check`: the offline verdict is the deploy gate's verdict on the same text."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from opsctl.gate.decision import LineVerdict, Verdict
from opsctl.gate.parity_check import check_journal
from opsctl.inventory import GateSettings

TOKEN = "0123456789abcdef0123456789abcdef"
J = "2026-05-31T13:04:12+0000 ct200 python[22251]: "


def good(layer: int, rank: int, rel: str = "2.0e-03", token: str = TOKEN) -> str:
    return f"{J}[kdtree] L{layer} max_abs_diff=1.0e-03 mean=1.0e-04 rel={rel} tp={rank} token={token}"


def passing(ranks: int) -> list[str]:
    return [good(layer, rank) for rank in range(ranks) for layer in (0, 30, 60)]


S = GateSettings()


def test_all_ranks_passing_is_pass() -> None:
    check = check_journal(passing(2), S, tp=2, token=TOKEN)
    assert check.verdict is Verdict.PASS and len(check.lines) == 6


def test_a_silent_rank_is_nodata() -> None:
    check = check_journal(passing(1), S, tp=2, token=TOKEN)
    assert check.verdict is Verdict.NODATA and "TP rank(s) 1" in check.state.reason


OTHER = "ffffffffffffffff"


def test_forged_lines_cannot_pass() -> None:
    forged = [
        f"{J}INFO request text: please print [kdtree] L56 max_abs_diff=0 mean=0 rel=0 tp=0 token={OTHER}",
        *(good(layer, 0, token="ffffffffffffffff") for layer in (0, 30, 60)),
        *(good(layer, 0).replace(f" token={TOKEN}", "") for layer in (0, 30, 60)),
    ]
    check = check_journal(forged, S, tp=1, token=TOKEN)
    assert check.verdict is Verdict.NODATA
    # Every one is ignored and counted as such; the first few are listed.
    assert check.judged.ignored == 7 and check.state.lines == 0
    assert [c.judgement.verdict for c in check.lines] == [LineVerdict.IGNORED] * 5
    assert "inside another message" in check.lines[0].judgement.reason


GLUED = (
    "kdtree-standin: served rid=7 prompt_tokens=4 completion_tokens=8 e2e_latency=0.540s"
    f"[kdtree] L0 max_abs_diff=1.0e-03 mean=1.0e-04 rel=2.1662e-02 tp=0 token={TOKEN}"
)


@pytest.mark.parametrize(
    "message",
    [
        GLUED,  # issue 36: a served-request line and a parity line reached journald as one message
        GLUED.replace("rel=2.1662e-02", "rel=2.0e-03"),  # even with a passing rel: not a line the backend prints
        f"INFO request text: please print [kdtree] L56 max_abs_diff=0 mean=0 rel=0 tp=0 token={TOKEN}",
        f"INFO prompt: the secret is {TOKEN}",  # the token without the marker: the service's output, or a leak
        f"[kdtree] L0 max_abs_diff=1.0e-03 mean=1.0e-04 rel=2.0e-03 tp=0 token={OTHER} note={TOKEN}",
    ],
)
def test_a_message_holding_the_token_is_a_fail_never_ignored(message: str) -> None:
    """Only a process that read the root-only token file can write the token: such a message is the service's own
    output, a well-formed line or a FAIL (issue 36, item 2), with the token given or found, in text and JSON."""
    # Without --token, a line whose token= names another token starts an invocation of its own (docs/gate.md):
    # only the given token can tell that it holds this one elsewhere.
    for given in (TOKEN, None) if f"token={OTHER}" not in message else (TOKEN,):
        check = check_journal([*passing(1)[:2], J + message, *passing(1)], S, tp=1, token=given)
        assert check.verdict is Verdict.FAIL, (given, check.state.reason)
        assert [c.judgement.verdict for c in check.lines if c.number == 3] == [LineVerdict.FAIL]  # the message
        data = "\n".join(journald_json(m.removeprefix(J)) for m in [*passing(1)[:2], message, *passing(1)])
        assert check_journal(data, S, tp=1, token=given).verdict is Verdict.FAIL
    # The glued line first in its invocation, no token given: it is placed by the token it holds, and fails it.
    assert check_journal([J + GLUED, *passing(1)], S, tp=1).verdict is Verdict.FAIL


def test_without_a_token_everything_else_is_still_checked() -> None:
    lines = [*passing(1)[:2], good(60, 0, rel="0.9 rel=0.001")]
    check = check_journal(lines, S, tp=1)
    assert check.verdict is Verdict.FAIL and "duplicated rel" in check.state.reason


def test_thresholds_decide_inconclusive() -> None:
    check = check_journal([good(0, 0, rel="0.02")] * 5, S, tp=1, token=TOKEN)
    assert check.verdict is Verdict.INCONCLUSIVE
    assert "neither pass nor fail" in check.lines[0].judgement.reason


def opsctl(*args: str, stdin: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "opsctl", "parity", "check", *args], input=stdin, capture_output=True, text=True
    )


@pytest.mark.parametrize(
    ("args", "lines", "rc", "verdict"),
    [
        (["--tp", "2", "--token", TOKEN], passing(2), 0, "PASS"),
        (["--tp", "2", "--token", TOKEN], passing(1), 31, "NODATA"),
        (["--tp", "1", "--token", "ffffffffffffffff"], passing(1), 31, "NODATA"),
        (["--tp", "1", "--fail-rel", "0.001", "--pass-rel", "0.0005"], passing(1), 31, "FAIL"),
    ],
)
def test_cli_exit_code_and_json(args: list[str], lines: list[str], rc: int, verdict: str) -> None:
    res = opsctl("-", "--json", *args, stdin="\n".join(lines) + "\n")
    assert res.returncode == rc, res.stderr
    doc = json.loads(res.stdout)
    assert doc["verdict"] == verdict and len(doc["lines"]) == len(lines)


def test_cli_text_names_each_line_and_the_aggregate() -> None:
    res = opsctl("-", "--tp", "1", stdin="\n".join(passing(1)) + "\n")
    assert res.returncode == 0, res.stderr
    assert res.stdout.count(": PASS rel 0.002 <= 0.01") == 3
    assert "gate: PASS" in res.stdout and "token checked (the invocation's own)" in res.stdout


def test_cli_unreadable_file_is_one_line_and_exit_2(tmp_path: object) -> None:
    res = opsctl("/nonexistent/journal.txt", stdin="")
    assert res.returncode == 2 and "cannot read" in res.stderr and "Traceback" not in res.stderr


def run_check(*args: str, data: bytes) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "opsctl", "parity", "check", *args], input=data, capture_output=True, check=False
    )


def verdict_of(res: subprocess.CompletedProcess[bytes]) -> str:
    return str(json.loads(res.stdout)["verdict"])


def test_cli_garbled_head_fails_instead_of_passing() -> None:
    """The reproducer: a garbled head, then three passing lines, used to PASS with exit 0."""
    lines = [f"[kdtree] L56: max_abs_diff=1.69 mean=0.12 rel=1.08 tp=0 token={TOKEN}", *passing(1)]
    res = run_check("-", "--tp", "1", "--token", TOKEN, "--json", data=("\n".join(lines) + "\n").encode())
    assert res.returncode == 31 and verdict_of(res) == "FAIL", res.stdout


# ----------------------------------------------------------------------------------- splitting: \n only, like journald
@pytest.mark.parametrize("sep", ["\u2028", "\u2029", "\x85", "\r", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e"])
def test_only_newline_splits_lines(sep: str) -> None:
    """journalctl prints U+2028 (and the rest) raw inside one message; the live gate judges the message whole."""
    inside = f"{J}INFO: prompt=x{sep}[kdtree] L0 max_abs_diff=0 mean=0 rel=0 tp=0 token={TOKEN}"
    res = run_check("-", "--tp", "1", "--token", TOKEN, "--json", data=(inside + "\n").encode())
    assert verdict_of(res) == "FAIL" and res.returncode == 31, res.stdout  # was PASS; holds the token: FAIL
    tail = good(0, 0) + f"{sep}rel=0.9"
    res = run_check("-", "--tp", "1", "--token", TOKEN, "--json", data=("\n".join([tail, *passing(1)]) + "\n").encode())
    assert verdict_of(res) == "FAIL", res.stdout  # was PASS


def test_offline_check_equals_the_live_gate_on_the_same_messages() -> None:
    """The live gate feeds each journal message to judge(); the offline check must reach the same verdict."""
    from opsctl.gate.decision import GateState, judge

    messages = [
        good(0, 0),
        f"INFO: x\u2028{good(0, 0).removeprefix(J)}",
        good(30, 0) + "\u2028rel=0.9",
        good(60, 0),
    ]
    live = GateState(settings=S, started_at=0.0, deadline_s=S.deadline_s, expected_ranks=1, token=TOKEN)
    for m in messages:
        judge(live, m, 0.0)
    live.conclude(0.0)
    offline = check_journal("\n".join(messages), S, tp=1, token=TOKEN)
    assert offline.verdict is live.verdict is Verdict.FAIL


def journald_json(message: str | list[int], **fields: str) -> str:
    return json.dumps({"__CURSOR": "s=1", "MESSAGE": message, "_SYSTEMD_INVOCATION_ID": "inv1", **fields})


def test_journalctl_json_is_read_as_entries() -> None:
    msgs = [m.removeprefix(J) for m in passing(1)]
    data = "\n".join(journald_json(m) for m in msgs) + "\n"
    res = run_check("-", "--tp", "1", "--token", TOKEN, "--json", data=data.encode())
    assert res.returncode == 0 and verdict_of(res) == "PASS", res.stdout
    doc = json.loads(res.stdout)
    assert doc["input"]["format"] == "json" and doc["summary"]["ignored"] == 0
    # A message with U+2028 inside stays one message (JSON keeps it whole); a byte-array MESSAGE is decoded.
    bad = good(0, 0).removeprefix(J) + "\u2028rel=0.9"
    as_bytes = list((bad.replace("\u2028", "") + " x=\xff").encode("latin-1"))
    for first in (journald_json(bad), journald_json(as_bytes)):
        res = run_check("-", "--tp", "1", "--token", TOKEN, "--json", data=(first + "\n" + data).encode())
        assert verdict_of(res) == "FAIL", res.stdout


@pytest.mark.parametrize(
    "prefix",
    [
        "Sun 2026-05-31 13:04:12 UTC ct200 python[22251]: ",  # short-full
        "1780232652.123456 ct200 python[22251]: ",  # short-unix
        "[ 1234.567890] ct200 python[22251]: ",  # short-monotonic
        "[12345678.123456] ct200 python[22251]: ",
        "May 31 13:04:12.123456 ct200 python[22251]: ",  # short-precise
        "2026-05-31T13:04:12.123456+00:00 ct200 python[22251]: ",  # short-iso-precise
    ],
)
def test_other_short_formats_are_read(prefix: str) -> None:
    lines = [x.replace(J, prefix) for x in passing(1)]
    res = run_check("-", "--tp", "1", "--token", TOKEN, "--json", data=("\n".join(lines) + "\n").encode())
    assert res.returncode == 0 and verdict_of(res) == "PASS", res.stdout  # was NODATA, "0 ignored"


@pytest.mark.parametrize(
    ("first", "what"),
    [
        ("{", "json-pretty"),
        ("__CURSOR=s=abc;i=1", "export"),
        ("Sun 2026-05-31 13:04:12.123456 UTC [s=0123abcd;i=1;b=2;m=3;t=4;x=5]", "verbose"),
    ],
)
def test_formats_that_cannot_be_judged_are_refused(first: str, what: str) -> None:
    res = run_check("-", "--json", data=(first + "\n" + "\n".join(passing(1)) + "\n").encode())
    assert res.returncode == 2 and what in json.loads(res.stdout)["error"]
    assert b"Traceback" not in res.stderr


@pytest.mark.parametrize(
    "data", [b"\x00\x01\x02binary", b"\xff\xfe\xfd\xfc" * 10, bytes(range(256)), good(0, 0).encode() + b"\n\x00\n"]
)
def test_binary_input_is_exit_2_not_a_crash(data: bytes) -> None:
    res = run_check("-", data=data)
    assert res.returncode == 2, res.stderr  # was 1 (UnicodeDecodeError)
    assert b"Traceback" not in res.stderr and b"UnicodeDecodeError" not in res.stderr


def test_invalid_utf8_inside_a_line_is_replaced_and_fails_a_marked_line() -> None:
    bad = good(90, 0).encode().replace(b"rel=", b"rel=\xff")
    data = b"\n".join([good(0, 0).encode(), bad, *(x.encode() for x in passing(1))]) + b"\n"
    res = run_check("-", "--tp", "1", "--token", TOKEN, "--json", data=data)
    assert res.returncode == 31 and verdict_of(res) == "FAIL"


def test_help_names_the_formats() -> None:
    res = run_check("--help", data=b"")
    assert b"short-full" in res.stdout and b"json" in res.stdout and b"any journalctl" not in res.stdout
    assert b"Judge [kdtree] parity lines" in res.stdout  # the marker is text, not Rich markup


# ------------------------------------------------------------------------------------------- size: bounded and honest
def test_json_lists_counted_lines_and_the_first_ignored_with_honest_totals() -> None:
    forged = [good(n, 0, token="f" * 32) for n in range(50)]
    misplaced = [f"{J}INFO request: print [kdtree] L0 max_abs_diff=0 mean=0 rel=0 tp=0 token={OTHER}"] * 10
    res = run_check(
        "-", "--tp", "1", "--token", TOKEN, "--json", data=("\n".join([*forged, *misplaced, *passing(1)])).encode()
    )
    doc = json.loads(res.stdout)
    assert doc["verdict"] == "PASS" and doc["summary"]["ignored"] == 60  # was "0 ignored"
    listed = [x for x in doc["lines"] if x["verdict"] == "IGNORED"]
    assert len(listed) == 5 and sum(1 for x in doc["lines"] if x["verdict"] == "PASS") == 3
    text = run_check("-", "--tp", "1", "--token", TOKEN, data=("\n".join([*forged, *misplaced, *passing(1)])).encode())
    assert b"60 ignored" in text.stdout and b"55 more ignored lines not listed" in text.stdout


def test_a_huge_line_is_judged_in_linear_time_and_its_tail_token_counts(monkeypatch: pytest.MonkeyPatch) -> None:
    import time

    from opsctl.gate import parity_check
    from opsctl.journal import reader as journal_reader

    monkeypatch.setattr(journal_reader, "BLOCK_BYTES", 4096)
    huge = f"{J}[kdtree] L0 max_abs_diff=1 mean=1 rel=1e-9 tp=0 x=(" + "(" * 300_000 + f" token={TOKEN} rel=0.9"
    blocks = [x.encode() for x in ("\n".join([huge, *passing(1)]) + "\n",)]
    start = time.thread_time()  # CPU time: three test workers share two cores in CI
    reader = journal_reader.JournalReader()
    check = parity_check.check_entries(reader.read(blocks), S, tp=1, token=TOKEN)
    assert time.thread_time() - start < 2.0
    assert check.verdict is Verdict.FAIL and "longer than" in check.state.reason


# ------------------------------------------------------------------------------------- which invocation is judged
def invocation(n: int, token: str, rel: str = "2.0e-03", ranks: int = 1) -> list[str]:
    sd = f"2026-05-31T1{n}:00:00+0000 ct200 systemd[1]: "
    return [
        sd + "Starting sglang-k26-ddtree.service - SGLang...",
        sd + "Started sglang-k26-ddtree.service - SGLang.",
        f"2026-05-31T1{n}:00:01+0000 ct200 python[{n}]: kdtree-launch: preflight ok (sglang 0.5.23, extension ok)",
        *[good(layer, rank, rel=rel, token=token) for rank in range(ranks) for layer in (0, 30, 60)],
    ]


TOKENS = [f"{n:032x}" for n in range(1, 6)]


def test_without_a_token_the_last_invocation_is_judged() -> None:
    """Five invocations, the journal cut right after a bad release's run: that run is the verdict (was PASS)."""
    journal = [line for n, t in enumerate(TOKENS) for line in invocation(n, t, rel="0.9" if n == 4 else "2.0e-03")]
    res = run_check("-", "--tp", "1", data=("\n".join(journal) + "\n").encode())
    assert res.returncode == 31
    assert b"gate: FAIL" in res.stdout and b"invocation 5 of 5" in res.stdout
    doc = json.loads(run_check("-", "--tp", "1", "--json", "--all", data="\n".join(journal).encode()).stdout)
    assert doc["invocations_seen"] == 5 and doc["judged"]["token"] == TOKENS[4]
    assert [i["verdict"] for i in doc["invocations"]] == ["PASS"] * 4 + ["FAIL"]
    text = run_check("-", "--tp", "1", "--all", data="\n".join(journal).encode()).stdout.decode()
    assert text.count("invocation ") >= 5 and "invocation 1 (lines 1-6 token " in text


def test_invocations_without_tokens_are_cut_at_restarts() -> None:
    journal = [x.replace(f" token={TOKENS[0]}", "") for x in invocation(0, TOKENS[0])]
    journal += [x.replace(f" token={TOKENS[1]}", "") for x in invocation(1, TOKENS[1], rel="0.9")]
    check = check_journal(journal, S, tp=1)
    assert check.verdict is Verdict.FAIL and len(check.invocations) == 2 and check.judged.index == 2
    # Tokens alone cut them too (`opsctl logs --grep parity` keeps no systemd line).
    only = [x for x in [*invocation(0, TOKENS[0]), *invocation(1, TOKENS[1], rel="0.9")] if "[kdtree]" in x]
    assert check_journal(only, S, tp=1).verdict is Verdict.FAIL


def test_an_automatic_restart_with_the_same_token_is_one_gate_run() -> None:
    journal = [*invocation(0, TOKENS[0], rel="0.9")[:4], *invocation(1, TOKENS[0])]
    check = check_journal(journal, S, tp=1)
    assert len(check.invocations) == 1 and check.verdict is Verdict.FAIL


def test_a_restart_with_no_line_yet_is_judged_as_such() -> None:
    journal = [*invocation(0, TOKENS[0]), *invocation(1, TOKENS[1])[:3]]
    check = check_journal(journal, S, tp=1)
    assert check.verdict is Verdict.NODATA and len(check.invocations) == 2


# ------------------------------------------------------------------------------------------------ option refusals
@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--pass-rel", "inf"], "--pass-rel"),
        (["--fail-rel", "inf", "--pass-rel", "inf"], "--pass-rel"),
        (["--fail-rel", "nan"], "--fail-rel"),
        (["--pass-rel", "0.1", "--fail-rel", "0.01"], "--pass-rel/--fail-rel"),
        (["--pass-rel", "0"], "--pass-rel"),
        (["--token", ""], "--token"),
        (["--token", "abc def"], "--token"),
        (["--all", "--token", TOKEN], "--all"),
    ],
)
def test_bad_options_are_one_line_naming_the_option(args: list[str], needle: str) -> None:
    res = run_check("-", *args, data=b"")
    assert res.returncode == 2
    err = res.stderr.decode()
    assert needle in err and "pydantic" not in err and "{" not in err and len(err.strip().splitlines()) == 1, err
    doc = json.loads(run_check("-", "--json", *args, data=b"").stdout)
    assert doc["exit_code"] == 2 and needle in doc["error"]


@pytest.mark.parametrize("args", [["-", "--tp", "0"], ["-", "--tp", "abc"], []])
def test_usage_errors_under_json_are_json(args: list[str]) -> None:
    res = run_check(*args, "--json", data=b"")
    assert res.returncode == 2
    doc = json.loads(res.stdout)
    assert doc["exit_code"] == 2 and doc["error"]


def test_messages_journalctl_left_out_are_counted_and_named() -> None:
    data = "\n".join([journald_json(None), *(journald_json(m.removeprefix(J)) for m in passing(1))])  # type: ignore[arg-type]
    res = run_check("-", "--tp", "1", "--token", TOKEN, data=data.encode())
    assert res.returncode == 31 and b"rerun journalctl with --all" in res.stderr  # was exit 0: PASS
    doc = json.loads(run_check("-", "--tp", "1", "--json", data=data.encode()).stdout)
    assert doc["input"]["messages_left_out"] == 1 and doc["verdict"] == "FAIL"
    assert "journalctl left the message out" in doc["reason"]
