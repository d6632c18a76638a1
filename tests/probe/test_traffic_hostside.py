"""The probe's host program (opsctl/probe/traffic_on_host.py), issue 36 items 7-9 and issue 37's workload, against
the SGLang-shaped server of test_traffic.py in this process: the configuration on stdin (a 140 KB prompt), the
wave's budget (never past the deadline, back to the gate between requests), the API key read as systemd reads the
environment file and never echoed, and the comparison workload's per-request record."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from opsctl.comparison.sample import ComparisonSample
from opsctl.comparison.workload import compare_config, parse_compare, run_compare_workload, run_workload
from opsctl.inventory import HostConfig
from opsctl.probe import envfile, modes, readings, stream, traffic_on_host
from opsctl.probe.traffic import ProbeClient
from tests import builders
from tests.pipeline.localremote import LocalRemote
from tests.probe.test_traffic import KEY, Server, cfg


@pytest.fixture
def srv() -> Iterator[Server]:
    s = Server()
    yield s
    s.httpd.shutdown()
    s.httpd.server_close()


def host_for(srv: Server, env_file: str | None = None, **compare: object) -> HostConfig:
    return builders.host(
        "h1",
        gpu_arch=None,
        service={"mode": "sglang", "port": srv.port, "tp": 1, "environment_file": env_file},
        gate={"probe": {"requests": 1, "max_new_tokens": 3}, "compare": {"warmup": 1, "max_new_tokens": 4, **compare}},
    )


# ------------------------------------------------------------------------------------------------ item 7


def test_a_140_kb_prompt_travels_on_stdin_and_is_answered(srv: Server) -> None:
    """Today: `python3 - CONFIG` with the prompt in argv -> 'Argument list too long' (one argument <= 128 KiB)."""
    prompt = "word " * 28_000  # 140,000 characters
    host = builders.host(
        "h1",
        gpu_arch=None,
        service={"mode": "sglang", "port": srv.port, "tp": 1},
        gate={"probe": {"requests": 1, "max_new_tokens": 2, "prompts": [prompt]}},
    )
    remote = LocalRemote()
    wave = ProbeClient(host, lambda: remote).wave()
    assert wave.answered == 1 and srv.bodies[-1]["text"] == prompt
    assert remote.commands == ["python3 -"]  # nothing of the configuration in argv


# ------------------------------------------------------------------------------------------------ item 8


def test_no_request_starts_after_start_within_s(srv: Server) -> None:
    """256 requests at concurrency 1 were one wave of up to 256 x timeout_s with no journal poll in between."""
    srv.mode = "slow"  # 1.5 s per answer
    t = time.monotonic()
    out = traffic_on_host.run(cfg(srv, requests=256, concurrency=1, timeout_s=3600, start_within_s=0.2))
    assert len(out["requests"]) == 1 and out["unsent"] == 255 and out["requests"][0]["ok"]
    assert time.monotonic() - t < 5


def test_no_request_runs_past_finish_within_s(srv: Server) -> None:
    srv.mode = "slow"
    t = time.monotonic()
    out = traffic_on_host.run(cfg(srv, requests=4, concurrency=1, timeout_s=3600, finish_within_s=1.2))
    assert time.monotonic() - t < 2.3
    assert [r["kind"] for r in out["requests"]] == ["cut"] and out["unsent"] == 3
    assert out["requests"][0]["error"] == "cut short by the gate's deadline after 1.2s (timeout_s 3600)"


def test_the_client_numbers_on_past_unsent_requests_and_bounds_its_command(srv: Server) -> None:
    srv.mode = "slow"
    host = builders.host(
        "h1",
        gpu_arch=None,
        service={"mode": "sglang", "port": srv.port, "tp": 1},
        gate={"probe": {"requests": 3, "concurrency": 1, "timeout_s": 3600}},
    )
    client = ProbeClient(host, lambda: LocalRemote(), rid_prefix="p")
    wave = client.wave(start_within_s=0.1, finish_within_s=10)
    assert (len(wave.requests), wave.unsent, client.next_n) == (1, 2, 3)


# ------------------------------------------------------------------------------------------------ item 9


def test_the_key_is_read_as_systemd_splits_lines_not_at_nel(srv: Server, tmp_path: Path) -> None:
    """str.splitlines() split at U+0085: `OTHER=x\\x85SGLANG_API_KEY=injected` sent `injected`."""
    env = tmp_path / "sglang.env"
    env.write_text("OTHER=x\x85SGLANG_API_KEY=injected\n", encoding="utf-8")
    out = traffic_on_host.run(cfg(srv, requests=1, env_file=str(env)))
    assert out["auth"] is False and srv.auth[-1] is None


@pytest.mark.parametrize("bad", ["sk-\u20ac-secret", "sk-\x01-secret", "sk-\x85-secret", "sk-\u2028x"])
def test_a_key_that_cannot_go_in_a_header_is_refused_and_never_echoed(srv: Server, tmp_path: Path, bad: str) -> None:
    """A non-Latin-1 key crashed the probe with the character and its offset in the message."""
    env = tmp_path / "sglang.env"
    env.write_text(f"SGLANG_API_KEY={bad}\n", encoding="utf-8")
    srv.api_key = "whatever"
    out = traffic_on_host.run(cfg(srv, requests=1, env_file=str(env)))
    text = json.dumps(out, ensure_ascii=False)
    assert out["auth"] is False and "cannot be sent in an HTTP header" in out["auth_error"]
    assert out["requests"][0]["status"] == 401 and srv.auth[-1] is None
    # Neither the key, nor its odd character, nor a position in it
    assert bad not in text and bad[3] not in text and "position" not in text and "secret" not in text


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("K=v\n", "v"),
        ("  K  =  v w  \n", "v w"),
        ('K="a \\"b\\" \\$c \\x"\n', 'a "b" $c \\x'),
        ("K='a \\n $b'\n", "a \\n $b"),
        ("K=a\\\nb\n", "ab"),
        ('K="a\\\nb"\n', "ab"),
        ("K='a'\"b\"c\n", "abc"),
        ("# K=comment\nK=1\n; K=2\n", "1"),
        ("#c \\\nK=continued-comment\nK=3\n", "3"),
        ("K=1\nK=2\n", "2"),
        ("K=a\rK=b\n", "b"),
        ("K=a\x0cK=b\n", "a\x0cK=b"),
        ("K=a\u2028K=b\n", "a\u2028K=b"),
        ("K", None),
        ("1K=x\nK-1=y\n", None),
        ("K=", ""),
    ],
)
def test_environment_file_syntax_as_systemd_reads_it(text: str, expected: str | None) -> None:
    assert envfile.parse_environment_file(text).get("K") == expected


def test_unreadable_and_non_utf8_files_are_named_without_content(tmp_path: Path) -> None:
    env = tmp_path / "k.env"
    env.write_bytes(b"K=\xff\xfesecret\n")
    value, why = envfile.read_env_value(str(env), "K")
    assert value is None and why is not None and "not UTF-8" in why and "secret" not in why
    assert envfile.read_env_value(str(tmp_path), "K")[1] is not None  # a directory: cannot read


# ------------------------------------------------------------------------------------------------ issue 37: workload


def test_the_workload_warms_up_then_sends_each_prompt_once_and_keeps_what_the_judge_needs(srv: Server) -> None:
    srv.spec = {"spec_accept_length": 2.5, "spec_verify_ct": 2}
    srv.metrics = '# HELP x\nsglang:num_running_reqs{tp_rank="0"} 1.0\nsglang:num_running_reqs{tp_rank="1"} 2\n'
    host = host_for(srv, prompts=["a", "b", "c"], concurrency=1)
    remote = LocalRemote()
    run = run_workload(remote, host, rid_prefix="opsctl-compare-abc")
    assert remote.commands == ["python3 -"]
    rids = sorted(b["rid"] for b in srv.bodies)
    assert rids == [f"opsctl-compare-abc-{n}" for n in range(4)]
    by_rid = {b["rid"]: b for b in srv.bodies}
    assert [by_rid[f"opsctl-compare-abc-{n}"]["text"] for n in range(4)] == ["a", "a", "b", "c"]  # warmup: "a"
    assert all(b["sampling_params"] == {"max_new_tokens": 4, "temperature": 0} for b in srv.bodies)
    assert (run.warmup_sent, run.warmup_failed, run.unsent) == (1, 0, 0)
    sample = run.sample
    assert sample.load_source == "metrics" and len(sample.requests) == 3
    for r in sample.requests:
        assert r.ok and r.output_ids == (0, 1, 2, 3) and r.completion_tokens == 4 and r.status == 200
        assert r.spec_accept_length == 2.5 and r.spec_verify_ct == 2 and r.load == 3.0
        assert r.ttft_s is not None and r.decode_s_per_token is not None and r.decode_s_per_token >= 0
        assert r.concurrency == 1 and r.decode_s is not None and r.decode_s >= 0
    assert ComparisonSample.from_json(json.loads(json.dumps(sample.to_json()))) == sample


def test_the_workload_runs_at_each_concurrency_level_in_turn(srv: Server) -> None:
    # Issue 48: the prompts once per level, the warmup only before the first; each request says its level.
    run = run_workload(LocalRemote(), host_for(srv, prompts=["a", "b", "c"], concurrency=[1, 2]), rid_prefix="x")
    by_rid = {b["rid"]: b["text"] for b in srv.bodies}
    assert [by_rid[f"x-{n}"] for n in range(7)] == ["a", "a", "b", "c", "a", "b", "c"]
    assert run.warmup_sent == 1 and run.unsent == 0
    assert [r.concurrency for r in run.sample.requests] == [1, 1, 1, 2, 2, 2]
    assert all(r.ok and r.output_ids == (0, 1, 2, 3) for r in run.sample.requests)


def test_without_metrics_or_spec_fields_they_are_null(srv: Server) -> None:
    sample = run_compare_workload(LocalRemote(), host_for(srv, prompts=["a"], warmup=0))
    assert sample.load_source is None
    r = sample.requests[0]
    assert (r.load, r.spec_accept_length, r.spec_verify_ct) == (None, None, None) and r.ok


def test_failed_requests_are_recorded_with_status_and_error(srv: Server) -> None:
    srv.api_key = KEY  # no key sent: 401
    notes: list[str] = []
    sample = run_compare_workload(LocalRemote(), host_for(srv, prompts=["a", "b"], concurrency=1), note=notes.append)
    assert [(r.status, r.error, r.output_ids, r.decode_s_per_token) for r in sample.requests] == [
        (401, "HTTP 401: Unauthorized", (), None)
    ] * 2
    assert all(r.client_error and not r.ok for r in sample.requests)
    assert notes == ["comparison: 1 of 1 warmup request(s) failed"]


def test_ttft_and_decode_time_count_from_the_first_chunk_carrying_tokens() -> None:
    rec = {"ok": True, "output_ids": [1, 2, 3, 4, 5], "meta": {}, "ttft_s": 0.1, "first_token_s": 0.5,
           "first_tokens": 1, "last_s": 1.3, "status": 200, "error": None}  # fmt: skip
    out = modes.compare_record(rec, None)
    assert out["decode_s_per_token"] == pytest.approx(0.2) and out["ttft_s"] == 0.5 and out["completion_tokens"] == 5


def test_ids_streamed_cumulatively_or_in_pieces_are_merged() -> None:
    assert stream.merged_ids([1, 2], [1, 2, 3]) == [1, 2, 3]  # SGLang's default: cumulative
    assert stream.merged_ids([1, 2], [3, 4]) == [1, 2, 3, 4]  # --stream-output: pieces
    assert stream.merged_ids([1], [True]) == [1] and stream.merged_ids([1], "x") == [1]


def test_metric_value_sums_label_sets_and_ignores_lookalikes() -> None:
    text = 'sglang:num_running_reqs 2\nsglang:num_running_reqs_total 9\nsglang:num_running_reqs{a="b"} 1.5\n'
    assert readings.metric_value(text) == 3.5
    assert readings.metric_value("other 1\n") is None
    assert readings.metric_value("sglang:num_running_reqs NaN\n") is None


def test_the_workload_travels_on_stdin_with_its_settings(srv: Server) -> None:
    host = host_for(srv, input_ids=[[1, 2], [3]], concurrency=2, timeout_s=9)
    config = compare_config(host, rid_prefix="opsctl-compare-x")
    assert config["input_ids"] == [[1, 2], [3]] and config["endpoint"] == "/generate"
    assert (config["warmup"], config["concurrency"], config["max_new_tokens"], config["timeout_s"]) == (1, [2], 4, 9)
    assert "api_key" not in json.dumps(config).replace("api_key_env", "")


def test_parse_compare_refuses_an_answer_that_is_not_a_sample() -> None:
    with pytest.raises(ValueError, match="output_ids"):
        parse_compare(json.dumps({"sample": {"requests": [{"output_ids": ["1"], "decode_s_per_token": None,
                                                           "ttft_s": None, "spec_accept_length": None}]}}))  # fmt: skip
    with pytest.raises(ValueError, match="refused its configuration"):
        parse_compare('{"config_error": "x"}')


@pytest.mark.parametrize("levels", [[], [0], [True], ["8"], [1.5]])
def test_a_concurrency_list_that_is_not_levels_is_refused_on_the_host(levels: list[object]) -> None:
    cfg = {"mode": "compare", "host": "127.0.0.1", "port": 1, "endpoint": "/generate", "rid_prefix": "x",
           "max_new_tokens": 4, "timeout_s": 1, "prompts": ["a"], "concurrency": levels}  # fmt: skip
    with pytest.raises(ValueError, match="concurrency must be a number or a list of positive integers"):
        traffic_on_host.check_config(cfg)
    assert modes.levels(traffic_on_host.check_config({**cfg, "concurrency": [1, 8]})) == [1, 8]
    assert modes.levels(traffic_on_host.check_config({**cfg, "concurrency": 4})) == [4]
