"""opsctl/captures/ without SSH: the request document (read back by the backend's own parser), the listing
script (run here with python3 on captures the backend really wrote), the prune plan, the remote command lines
(replay_command run here through bash against a release-like tree) and the judgement of the replay's output."""

from __future__ import annotations

import datetime as dt
import json
import shlex
import subprocess
import time
from pathlib import Path

import pytest
from kdtree_backend.wire import CAPTURE_ID_RE

from opsctl.captures import arming, capture_replay, capturedir, pruning
from opsctl.captures.listing import (
    CallInfo,
    CaptureFailed,
    CaptureSet,
    Listing,
    RankDone,
    RequestState,
    capture_dir,
    parse_listing,
)
from opsctl.errors import UsageError
from opsctl.gate.decision import Verdict
from opsctl.host.replay import ReleaseCommand, capture_replay_command
from opsctl.inventory import GateSettings, HostConfig
from tests import builders

REPO = Path(__file__).resolve().parents[2]
TOKEN = "0123456789abcdef0123456789abcdef"


def host(tp: int = 2, root: str = "/root/kdtree-engine", python: str = "/usr/bin/python3") -> HostConfig:
    h = builders.host("h1", service={"tp": tp, "python": python, "mode": "replay"})
    # The inventory refuses unsafe roots; copied in unvalidated here, so that the quoting is what gets tested.
    return h.model_copy(update={"root": root})


# ---------------------------------------------------------------------------------------------- request


def test_parse_layers() -> None:
    assert arming.parse_layers("60, 0,30,0") == (0, 30, 60)
    for bad in ("", "a,b", "-1", ",,"):
        with pytest.raises(UsageError, match="--layers"):
            arming.parse_layers(bad)


def test_capture_ids_are_utc_stamps_the_backend_accepts() -> None:
    ident = arming.new_capture_id(
        dt.datetime(2026, 6, 1, 14, 0, 5, tzinfo=dt.timezone(dt.timedelta(hours=2))), "a1b2c3"
    )
    assert ident == "c20260601T120005Z-a1b2c3"
    assert CAPTURE_ID_RE.fullmatch(arming.new_capture_id())


def test_request_doc_splits_the_budget_over_ranks_and_the_backend_parses_it() -> None:
    parse_request = pytest.importorskip("kdtree_backend.capture_format").parse_request
    doc = arming.request_doc(
        capture_id="c20260601T120005Z-a1b2c3", layers=[30, 0], steps=3, max_mb=64, tp=8, host_now=1000.0, ttl_s=60
    )
    assert doc["max_bytes"] == 8 * 2**20 and doc["expires_at"] == 1060.0 and doc["layers"] == [0, 30]
    req = parse_request(json.loads(json.dumps(doc)))
    assert req.layers == (0, 30) and req.steps == 3 and req.max_bytes == 8 * 2**20


@pytest.mark.parametrize(
    ("over", "match"), [({"steps": 0}, "--steps"), ({"max_mb": 0}, "--max-mb"), ({"ttl_s": -1}, "--ttl")]
)
def test_request_doc_refuses_bad_values(over: dict[str, float], match: str) -> None:
    args: dict[str, object] = {
        "capture_id": "c20260601T120005Z-a1b2c3",
        "layers": [0],
        "steps": 1,
        "max_mb": 1,
        "tp": 1,
        "host_now": 0.0,
        **over,
    }
    with pytest.raises(UsageError, match=match):
        arming.request_doc(**args)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------- listing


def stored_capture(directory: Path, capture_id: str, *, steps: int = 1, tp: int = 0) -> None:
    """A capture written by the backend itself (its engine, CPU reference path)."""
    pytest.importorskip("torch")
    import torch
    from kdtree_backend.batch import make_verify_batch
    from kdtree_backend.capture import Capturer
    from kdtree_backend.config import ParityConfig
    from kdtree_backend.engine import VerifyEngine

    directory.mkdir(parents=True, exist_ok=True)
    (directory / "request.json").write_text(
        json.dumps(
            {"id": capture_id, "layers": [0], "steps": steps, "max_bytes": 10**8, "expires_at": time.time() + 60}
        )
    )
    capturer = Capturer(directory, release="rtest", tp=tp, poll_s=0.0, log=lambda _: None)
    engine = VerifyEngine(
        q_len=9, heads=2, parity=ParityConfig(False, 1, ()), use_kernel=False, sink=lambda _: None, capturer=capturer
    )
    for step in range(steps + 1):
        batch = make_verify_batch(bs=1, prefix=32, q_len=9, heads=2, seed=step)
        engine.prepare(
            **batch.metadata(),
            graph=False,
        )
        engine.forward(0, batch.q[0], batch.kv_buffers[0], torch.empty(9, 2, 512, dtype=torch.bfloat16), batch.sm_scale)
    capturer.drain()


def run_listing(directory: Path) -> Listing:
    program = capturedir.LISTING_PROGRAM
    res = subprocess.run(
        ["sh", "-c", program.command("python3")],
        input=program.payload(capturedir.listing_config(str(directory))),
        capture_output=True,
        text=True,
        check=True,
    )
    return parse_listing(res.stdout)


def test_the_listing_script_reports_what_the_backend_stored(tmp_path: Path) -> None:
    directory = tmp_path / "capture"
    stored_capture(directory, "c20260601T120005Z-a1b2c3", steps=2)
    (directory / "c20260601T120006Z-ffffff" / ".tp0-L0-s0.partial").mkdir(parents=True)  # a call being written
    (directory / "not-a-capture").mkdir()
    listing = run_listing(directory)
    assert [s.id for s in listing.sets] == ["c20260601T120005Z-a1b2c3", "c20260601T120006Z-ffffff"]
    done = listing.sets[0]
    assert [(c.tp, c.layer, c.step) for c in done.calls] == [(0, 0, 0), (0, 0, 1)]
    assert done.releases == ["rtest"] and done.complete(1) and not done.complete(2)
    assert done.done[0].reason == "steps" and done.done[0].calls == 2
    on_disk = sum(p.stat().st_size for p in (directory / done.id).rglob("*") if p.is_file())
    assert done.bytes == on_disk and done.bytes > sum(c.bytes for c in done.calls)
    assert listing.sets[1].partial == 1 and not listing.sets[1].calls
    assert listing.armed_id == "c20260601T120005Z-a1b2c3"  # request.json still there, not expired
    assert abs(done.age_s(listing.now) - (listing.now - done.created)) < 1e-6


def test_listing_of_a_host_that_never_captured_is_empty(tmp_path: Path) -> None:
    listing = run_listing(tmp_path / "nothing")
    assert listing.sets == [] and listing.armed_id is None


def test_parse_listing_refuses_garbage_and_skips_bad_entries() -> None:
    with pytest.raises(CaptureFailed, match="not JSON"):
        parse_listing("Traceback (most recent call last):")
    listing = parse_listing(json.dumps({"now": 5, "captures": [{"id": "../x"}, {"id": "c20260601T120005Z-a1b2c3"}]}))
    assert [s.id for s in listing.sets] == ["c20260601T120005Z-a1b2c3"]


def test_an_expired_request_is_not_armed() -> None:
    listing = Listing(now=100.0, directory="/d", request={"id": "c20260601T120005Z-a1b2c3", "expires_at": 99}, sets=[])
    assert listing.armed_id is None


def test_the_request_file_is_shown_whatever_it_holds() -> None:
    def state(request: object) -> RequestState | None:
        return Listing(now=100.0, directory="/d", request=request, sets=[]).request_state  # type: ignore[arg-type]

    armed = state({"id": "c20260601T120005Z-a1b2c3", "expires_at": 700})
    assert armed == RequestState("c20260601T120005Z-a1b2c3", "armed", 600.0)
    assert armed.text() == "capture c20260601T120005Z-a1b2c3 is armed (expires in 10m)"
    expired = state({"id": "c20260601T120005Z-a1b2c3", "expires_at": 40})
    assert expired is not None and expired.state == "expired" and "expired 60s ago" in expired.text()
    assert state({"garbage": 1}) == RequestState(None, "unreadable", None)
    assert state(None) is None


def test_prune_removes_a_dead_request_and_disarm_any() -> None:
    def listing(expires_at: float) -> Listing:
        return Listing(
            now=100.0, directory="/d", request={"id": "c20260601T120005Z-a1b2c3", "expires_at": expires_at}, sets=[]
        )

    assert pruning.request_to_remove(listing(40), prune=True, disarm=False) is not None  # expired: --prune clears it
    assert pruning.request_to_remove(listing(700), prune=True, disarm=False) is None  # armed: a capture under way
    assert pruning.request_to_remove(listing(700), prune=False, disarm=True) is not None
    assert pruning.request_to_remove(listing(40), prune=False, disarm=False) is None
    empty = Listing(now=100.0, directory="/d", request=None, sets=[])
    assert pruning.request_to_remove(empty, prune=True, disarm=True) is None


def test_arming_is_refused_where_no_managed_unit_runs() -> None:
    h = host()
    virgin = arming.arm_refusal(h, managed=False, current=None, active_state="inactive")
    assert virgin is not None and "no release deployed by opsctl" in virgin and "opsctl deploy" in virgin
    stopped = arming.arm_refusal(h, managed=True, current="r0123456789ab", active_state="failed")
    assert stopped is not None and "is failed, not running" in stopped
    assert arming.arm_refusal(h, managed=True, current="r0123456789ab", active_state="active") is None


# ---------------------------------------------------------------------------------------------- prune


def capture_set(day: int, mb: float, ident_suffix: str = "000000") -> CaptureSet:
    return CaptureSet(id=f"c202606{day:02d}T000000Z-{ident_suffix}", mtime=0.0, bytes=int(mb * 2**20))


def test_prune_plan_by_age_count_and_size_keeps_the_armed_one() -> None:
    now = dt.datetime(2026, 6, 20, tzinfo=dt.UTC).timestamp()
    sets = [capture_set(1, 1), capture_set(15, 10), capture_set(16, 10), capture_set(17, 10), capture_set(19, 10)]
    listing = Listing(now=now, directory="/d", request=None, sets=sets)
    limits = pruning.PruneLimits(keep=3, max_bytes=25 * 2**20, max_age_s=7 * 86400)
    plan = pruning.prune_plan(listing, limits)
    assert plan == [
        ("c20260601T000000Z-000000", "older than 7.0d (19.0d)"),
        ("c20260615T000000Z-000000", "over 25 MB in all"),
        ("c20260616T000000Z-000000", "over 25 MB in all"),
    ]
    armed = Listing(now=now, directory="/d", request={"id": sets[0].id, "expires_at": now + 60}, sets=sets)
    assert sets[0].id not in [i for i, _ in pruning.prune_plan(armed, limits)]
    assert [i for i, _ in pruning.prune_plan(listing, pruning.PruneLimits(keep=1, max_age_s=1e9))] == [
        s.id for s in sets[:4]
    ]


def test_prune_command_quotes_paths_and_refuses_what_is_not_a_capture() -> None:
    h = host(root="/srv/my root")
    cmd = pruning.prune_command(h, ["c20260601T120005Z-a1b2c3"])
    assert shlex.split(cmd) == ["rm", "-rf", "--", "/srv/my root/state/capture/c20260601T120005Z-a1b2c3"]
    with pytest.raises(UsageError, match="not a capture id"):
        pruning.prune_command(h, ["../../etc"])
    assert pruning.prune_command(h, []) == "true"


def test_list_command_quotes_the_directory() -> None:
    h = host(root="/srv/a b;rm -rf /")
    argv = shlex.split(capturedir.LISTING_PROGRAM.command(h.service.python))
    assert argv == ["/usr/bin/python3", "-"]  # the directory travels on stdin, in the configuration
    assert capturedir.listing_config(capture_dir(h))["dir"] == "/srv/a b;rm -rf //state/capture"


# ---------------------------------------------------------------------------------------------- replay


def replay_command(h: HostConfig, release_dir: str, token: str) -> ReleaseCommand:
    """The capture replay as the pre-restart check and `opsctl parity replay` build it from a host's settings."""
    return capture_replay_command(h.service.python, release_dir, capture_dir(h), token, threshold=h.gate.fail_rel)


def test_replay_command_is_quoted_and_refuses_a_bad_token() -> None:
    h = host(root="/srv/x y")
    cmd = replay_command(h, "/srv/x y/releases/r0123456789ab/", TOKEN)
    argv = shlex.split(cmd.command)
    assert argv[:3] == ["cd", "/srv/x y/releases/r0123456789ab", "&&"]
    assert TOKEN not in cmd.command and cmd.stdin == TOKEN + "\n" and TOKEN not in repr(cmd)
    assert "PYTHONPATH=/srv/x y/releases/r0123456789ab/kernel:/srv/x y/releases/r0123456789ab/backend" in argv
    assert argv[-7:] == [
        "/usr/bin/python3",
        "-m",
        "kdtree_backend.replay",
        "--captures",
        "/srv/x y/state/capture",
        "--threshold",
        "0.05",
    ]
    with pytest.raises(UsageError, match="token"):
        replay_command(h, "/r", "bad token; rm -rf /")


def test_replay_command_runs_and_its_output_is_judged_pass(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    import sys

    root = tmp_path / "root"
    release = root / "releases" / "r0123456789ab"
    release.mkdir(parents=True)
    for part in ("kernel", "backend", "deploy"):
        (release / part).symlink_to(REPO / part)
    stored_capture(root / "state" / "capture", "c20260601T120005Z-a1b2c3", steps=2, tp=1)
    h = host(tp=2, root=str(root), python=sys.executable)
    cmd = replay_command(h, str(release), TOKEN)
    res = subprocess.run(["sh", "-c", cmd.command], input=cmd.stdin, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    judged = capture_replay.judge_replay(res.stdout, res.returncode, h.gate, h.service.tp, TOKEN, res.stderr)
    assert judged.verdict is Verdict.PASS and judged.calls == 2, judged.reason
    assert [j.line.rank for j in judged.judgements if j.line] == [1, 1]
    assert judged.to_json()["lines"][0]["capture"] == "c20260601T120005Z-a1b2c3/tp1-L0-s0"


def line(rel: float, tp: int = 0, token: str = TOKEN) -> str:
    return f"[kdtree] L0 max_abs_diff=1.0e-02 mean=1.0e-03 rel={rel:.4e} tp={tp} token={token} capture=c/x"


def summary(calls: int, damaged: int = 0) -> str:
    return f"kdtree-replay: captures={calls} damaged={damaged} worst_rel=0 threshold=0.05 exit=0 elapsed_s=0.1"


@pytest.mark.parametrize(
    ("stdout", "rc", "stderr", "verdict", "reason"),
    [
        ([line(0.001), line(0.002, tp=1), summary(2)], 0, "", Verdict.PASS, "2 captured call(s) replayed"),
        ([line(0.001), line(1.1, tp=1), summary(2)], 3, "", Verdict.FAIL, "rel=1.1 >= fail threshold"),
        ([line(0.02), summary(1)], 0, "", Verdict.INCONCLUSIVE, "between pass and fail"),
        ([summary(0)], 0, "", Verdict.NODATA, "no captures stored"),
        ([line(0.001, token="forged-token-1"), summary(1)], 0, "", Verdict.NODATA, "ignored"),
        ([line(0.001, tp=5), summary(1)], 0, "", Verdict.FAIL, "outside the unit's 2 TP ranks"),
        ([line(0.001), summary(1, damaged=1)], 3, "kdtree-replay: capture c/x skipped: sha256", Verdict.FAIL, "sha256"),
        (["Traceback ..."], 1, "ModuleNotFoundError: torch", Verdict.ERROR, "could not run (exit 1)"),
        ([line(0.001), "Traceback ..."], 1, "", Verdict.ERROR, "token=<token> capture=c/x | Traceback"),
    ],
)
def test_judge_replay(stdout: list[str], rc: int, stderr: str, verdict: Verdict, reason: str) -> None:
    judged = capture_replay.judge_replay("\n".join(stdout), rc, GateSettings(), 2, TOKEN, stderr)
    assert judged.verdict is verdict and reason in judged.reason, judged.reason
    assert TOKEN not in judged.reason  # a reason is printed and recorded: the replay's token stays out of it


def test_outcome_problem_says_what_to_do() -> None:
    s = CaptureSet(id="c20260601T120005Z-a1b2c3", mtime=0, bytes=0)
    s.done[0] = RankDone(0, 0, 0, 0, "max_bytes", "r", 0.0, needed=3 * 2**20)
    assert "raise --max-mb above 24" in (arming.outcome_problem(s, 8) or "")
    s.done[0] = RankDone(0, 0, 0, 1, "layers_not_in_graph", "r", 0.0)
    assert "pick --layers among them" in (arming.outcome_problem(s, 8) or "")
    s.done[0] = RankDone(0, 0, 0, 1, "graph_capture_off", "r", 0.0)
    assert "capture.in_graphs false" in (arming.outcome_problem(s, 8) or "")
    s.calls.append(CallInfo("tp0-L0-s0", 0, 0, 0, 10, "r", 0.0))
    assert arming.outcome_problem(s, 8) is None


# ---------------------------------------------------------------------------------------------- the CLI


def test_captures_cli_shows_what_is_left_and_the_request(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from opsctl.cli.main import main

    inv = tmp_path / "inventory.yaml"
    inv.write_text("hosts:\n  h1: {address: 127.0.0.1, gpu_arch: null, service: {tp: 2}}\n")
    now = dt.datetime(2026, 6, 20, tzinfo=dt.UTC).timestamp()
    armed, old = capture_set(19, 1, "a1b2c3"), capture_set(1, 1)
    armed.partial = 1
    found = Listing(
        now=now, directory="/r/state/capture", request={"id": armed.id, "expires_at": now + 60}, sets=[old, armed]
    )
    run = pruning.ListRun(found, [(old.id, "older than 7.0d (19.0d)")], None)
    monkeypatch.setattr(pruning, "list_captures", lambda host, limits, disarm=False: run)

    assert main(["-i", str(inv), "captures", "h1", "--prune", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["armed"] == armed.id and [c["id"] for c in doc["captures"]] == [armed.id]
    assert doc["pruned"] == [{"id": old.id, "why": "older than 7.0d (19.0d)"}]
    assert doc["request"] == {"id": armed.id, "state": "armed", "expires_in_s": 60.0, "removed": False}

    assert main(["-i", str(inv), "captures", "h1", "--prune"]) == 0
    text = capsys.readouterr().out
    assert f"pruned {old.id}" in text and "(--disarm removes it)" in text
    assert "armed (1 writing)" in text and "0/2" in text


def test_judge_replay_reads_a_line_as_what_ends_at_newline() -> None:
    """A passing line glued to a forged one by U+2028 is one line, as the gate's journal reader sees it: not a
    PASS line plus noise."""
    glued = line(0.001) + "\u2028" + line(0.002)
    judged = capture_replay.judge_replay("\n".join([glued, summary(1)]), 0, GateSettings(), 2, TOKEN)
    assert len(judged.judgements) == 1 and judged.verdict is not Verdict.PASS, judged.reason
    assert judged.judgements[0].raw == glued
