"""The stand-in server (python -m kdtree_backend.serve) as the testbed unit runs it: a subprocess on a free loopback
port, answered over HTTP. Readiness, SGLang's answer shapes, the API key, silence when idle, parity lines per
decode step under the burst/every-N rule, and every injected fault."""

from __future__ import annotations

import http.client
import json
import math
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kdtree_backend.config import ParityConfig

from tests.backend.helpers import PARITY_RE, buggy_release
from tests.backend.standin_proc import TOKEN, Standin, sse_events

PARITY = {"enabled": True, "every_n_steps": 4, "burst_steps": 3, "layers": [0, 30]}
REPLAY = {"bs": 2, "prefix": 32, "q_len": 9, "heads": 4, "layers": [0, 30]}
CONFIG = {"parity": PARITY, "replay": REPLAY}
SAMPLING = ParityConfig(True, PARITY["every_n_steps"], tuple(PARITY["layers"]), PARITY["burst_steps"])


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Standin]:
    s = Standin(tmp_path_factory.mktemp("standin"), config=CONFIG, load_delay=2.0)
    s.wait_started()
    yield s
    assert s.stop() == 0
    assert "SIGTERM received, stopping" in "\n".join(s.lines)


def ready(server: Standin) -> Standin:
    server.wait_ready()
    return server


def verify_steps(server: Standin) -> int:
    status, _, raw = server.get("/get_server_info")
    assert status == 200
    return int(json.loads(raw)["verify_steps"])


def parity_lines(lines: list[str]) -> list[tuple[int, float, int, str]]:
    """(layer, rel, tp, token) of each parity line."""
    out = []
    for line in lines:
        m = PARITY_RE.match(line)
        if m:
            token = line.rsplit("token=", 1)[1] if " token=" in line else ""
            out.append((int(m.group(1)), float(m.group(4)), int(m.group(5)), token))
    return out


def test_health_is_503_while_loading_then_200(server: Standin) -> None:
    status, _, _ = server.get("/health")
    assert status == 503  # the started line comes before the 2 s load delay has passed
    assert server.get("/ready")[0] == 503
    assert server.post("/generate", {"text": "x", "sampling_params": {"max_new_tokens": 1}})[0] == 503
    assert server.get("/health_generate")[0] == 503
    waited = server.wait_ready()
    assert 0.5 < waited < 30
    assert server.get("/ready")[0] == 200
    assert any(line.startswith("kdtree-standin: ready after") for line in server.lines)


def test_idle_server_prints_no_kdtree_line(server: Standin) -> None:
    ready(server)
    before = len(server.lines)
    for _ in range(10):  # health polls are not requests: no verify step, no line
        assert server.get("/health")[0] == 200
    time.sleep(3)
    assert [line for line in server.lines[before:] if line.startswith("[kdtree]")] == []


def test_generate_answers_like_sglang(server: Standin) -> None:
    ready(server)
    body = {
        "text": "the cat sat",
        "sampling_params": {"max_new_tokens": 3, "temperature": 0},
        "rid": "opsctl-probe-ab-1",
    }
    status, answer = server.post("/generate", body)
    assert status == 200
    assert len(answer["output_ids"]) == 3 and answer["text"].strip()
    meta = answer["meta_info"]
    assert meta["id"] == "opsctl-probe-ab-1"
    assert meta["finish_reason"] == {"type": "length", "length": 3}
    assert (meta["prompt_tokens"], meta["completion_tokens"]) == (3, 3)
    assert 1 <= meta["spec_verify_ct"] <= 3  # speculative: one verify step yields 1..depth+1 tokens
    assert meta["spec_accept_length"] == pytest.approx(3 / meta["spec_verify_ct"])
    assert meta["e2e_latency"] > 0
    again = server.post("/generate", body)[1]
    assert again["output_ids"] == answer["output_ids"]  # greedy: same prompt, same output
    batch = server.post("/generate", {"input_ids": [[1, 2], [3]], "sampling_params": {"max_new_tokens": 1}})
    assert batch[0] == 200 and [len(item["output_ids"]) for item in batch[1]] == [1, 1]
    assert [item["meta_info"]["prompt_tokens"] for item in batch[1]] == [2, 1]
    served = server.wait_line(lambda line: "served rid=opsctl-probe-ab-1" in line)
    assert "completion_tokens=3" in served and f"spec_verify_ct={meta['spec_verify_ct']}" in served


def test_generate_streams_server_sent_events(server: Standin) -> None:
    ready(server)
    body = {"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 3}, "stream": True, "rid": "s-1"}
    status, ctype, raw = server.request("POST", "/generate", json.dumps(body).encode())
    assert status == 200 and ctype.startswith("text/event-stream")
    events = sse_events(raw)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    lengths = [len(c["output_ids"]) for c in chunks]  # cumulative, one chunk per verify step (then the last)
    assert lengths == sorted(lengths) and lengths[-1] == 3 and all(n >= 1 for n in lengths)
    assert [c["meta_info"]["finish_reason"] for c in chunks][:-1] == [None] * (len(chunks) - 1)
    assert chunks[-1]["meta_info"]["finish_reason"] == {"type": "length", "length": 3}
    assert all(c["meta_info"]["id"] == "s-1" for c in chunks)
    assert [c["meta_info"]["spec_verify_ct"] for c in chunks][:-1] == list(range(1, len(chunks)))


def test_completions_answer_like_openai(server: Standin) -> None:
    ready(server)
    status, answer = server.post(
        "/v1/completions", {"model": "m", "prompt": "hi there", "max_tokens": 2, "temperature": 0}
    )
    assert status == 200
    assert answer["object"] == "text_completion" and answer["model"] == "m" and answer["id"].startswith("cmpl-")
    (choice,) = answer["choices"]
    assert choice["index"] == 0 and choice["finish_reason"] == "length" and choice["logprobs"] is None
    assert len(choice["text"].split()) == 2
    assert answer["usage"] == {"prompt_tokens": 2, "completion_tokens": 2, "total_tokens": 4}
    body = {"model": "m", "prompt": [1, 2], "max_tokens": 2, "stream": True}
    status, ctype, raw = server.request("POST", "/v1/completions", json.dumps(body).encode())
    events = sse_events(raw)
    assert status == 200 and ctype.startswith("text/event-stream") and events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None] * (len(chunks) - 1) + ["length"]
    assert all(c["object"] == "text_completion" for c in chunks)
    assert len("".join(c["choices"][0]["text"] for c in chunks).split()) == 2


def test_health_generate_and_server_info(server: Standin) -> None:
    ready(server)
    before = verify_steps(server)
    assert server.get("/health_generate")[0] == 200
    assert verify_steps(server) == before + 1  # one generation of one token: one decode step
    info = json.loads(server.get("/get_server_info")[2])
    assert info["version"] == "0.5.23" and info["tp_size"] == 2 and info["port"] == server.port
    assert info["attention_backend"] == "kdtree" and info["speculative_algorithm"] == "DDTREE"
    assert info["load_delay_s"] == 2.0 and info["skip_tokenizer_init"] is False and info["model_path"]


@pytest.mark.parametrize(
    ("path", "body", "message"),
    [
        ("/generate", b"{not json", "not valid JSON"),
        ("/generate", b"[1, 2]", "JSON object"),
        ("/generate", {"sampling_params": {"max_new_tokens": 1}}, "exactly one of text and input_ids"),
        ("/generate", {"text": "a", "sampling_params": {"max_new_tokens": -1}}, "max_new_tokens"),
        ("/generate", {"text": "a", "sampling_params": {"temperature": "hot"}}, "temperature"),
        ("/generate", {"input_ids": [1, "x"]}, "token ids"),
        ("/generate", {"text": ["a", "b"], "stream": True}, "stream with a batch"),
        ("/v1/completions", {"model": "m"}, "prompt is required"),
        ("/v1/completions", {"prompt": "a", "max_tokens": "many"}, "max_tokens"),
    ],
)
def test_malformed_body_is_400_with_sglang_error_shape(server: Standin, path: str, body: object, message: str) -> None:
    ready(server)
    before = verify_steps(server)
    status, _, raw = server.request("POST", path, body if isinstance(body, bytes) else json.dumps(body).encode())
    assert status == 400
    error = json.loads(raw)["error"]
    assert message in error["message"] and error["code"] == 400
    assert verify_steps(server) == before  # refused before any decode step


def test_unknown_route_is_404(server: Standin) -> None:
    ready(server)
    assert server.get("/nope")[0] == 404
    assert server.request("POST", "/health", b"{}")[0] == 404


def test_requests_print_every_ranks_parity_lines_under_the_burst_rule(server: Standin) -> None:
    ready(server)
    start = verify_steps(server)
    mark = len(server.lines)
    requests, tokens, steps = 3, 5, 0
    for n in range(requests):
        body = {"text": f"prompt {n}", "sampling_params": {"max_new_tokens": tokens, "temperature": 0}}
        status, answer = server.post("/generate", body)
        assert status == 200 and answer["meta_info"]["completion_tokens"] == tokens
        steps += answer["meta_info"]["spec_verify_ct"]
    end = verify_steps(server)
    assert end - start == steps
    sampled = sum(SAMPLING.sampled(step) for step in range(start, end))
    assert sampled >= 1
    lines = parity_lines(server.settled_lines()[mark:])
    assert len(lines) == sampled * len(PARITY["layers"]) * 2
    for rank in (0, 1):
        mine = [line for line in lines if line[2] == rank]
        assert [layer for layer, *_ in mine] == PARITY["layers"] * sampled
    assert all(token == TOKEN and rel < 1e-2 for _, rel, _, token in lines)


def test_the_first_steps_after_start_are_all_sampled(tmp_path: Path) -> None:
    """A fresh server: steps 0..burst-1 are sampled, then only every N-th (burst 3, N 4: 0 1 2 4 8 ...)."""
    s = Standin(tmp_path, config=CONFIG, load_delay=0, tp=1)
    try:
        s.wait_ready()
        status, answer = s.post("/generate", {"input_ids": [1], "sampling_params": {"max_new_tokens": 40}})
        assert status == 200
        steps = answer["meta_info"]["spec_verify_ct"]
        assert steps >= 9
        lines = parity_lines(s.settled_lines())
        sampled = [step for step in range(steps) if step < 3 or step % 4 == 0]
        assert sampled[:5] == [0, 1, 2, 4, 8]
        assert len(lines) == len(sampled) * 2  # two layers each
        assert "[kdtree] fallback reason=cpu_device path=reference" in s.lines
        assert sum("[kdtree] shapes" in line for line in s.lines) == 1
    finally:
        assert s.stop() == 0


def test_api_key_is_required_except_on_health(tmp_path: Path) -> None:
    key = "sk-standin-secret-4711"
    s = Standin(tmp_path, config=CONFIG, load_delay=0, tp=1, env={"SGLANG_API_KEY": key})
    try:
        s.wait_ready()
        body = {"text": "a", "sampling_params": {"max_new_tokens": 1}}
        assert s.get("/health")[0] == 200
        assert s.post("/generate", body)[0] == 401
        assert s.post("/generate", body, {"Authorization": "Bearer wrong"})[0] == 401
        assert s.post("/v1/completions", {"prompt": "a"})[0] == 401
        assert s.get("/get_server_info")[0] == 401
        assert s.get("/health_generate")[0] == 401
        assert s.get("/ready")[0] == 401
        auth = {"Authorization": f"Bearer {key}"}
        assert s.post("/generate", body, auth)[0] == 200
        assert s.get("/get_server_info", auth)[0] == 200
        assert any("api_key=required" in line for line in s.lines)
    finally:
        s.stop()
    assert key not in "\n".join(s.lines)


def test_api_key_env_names_the_variable(tmp_path: Path) -> None:
    s = Standin(tmp_path, config=CONFIG, load_delay=0, tp=1, args=("--api-key-env", "MY_KEY"), env={"MY_KEY": "k1"})
    try:
        s.wait_ready()
        assert s.get("/get_server_info")[0] == 401
        assert s.get("/get_server_info", {"Authorization": "Bearer k1"})[0] == 200
    finally:
        s.stop()


def test_skip_tokenizer_init_takes_input_ids_only(tmp_path: Path) -> None:
    s = Standin(tmp_path, config=CONFIG, load_delay=0, tp=1, args=("--skip-tokenizer-init",))
    try:
        s.wait_ready()
        status, answer = s.post("/generate", {"text": "a"})
        assert status == 400 and "input_ids" in answer["error"]["message"]
        status, answer = s.post("/generate", {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 2}})
        assert status == 200 and answer["text"] == "" and len(answer["output_ids"]) == 2
    finally:
        s.stop()


# ---------------------------------------------------------------------------------------------- faults

FAULTS = ("nan", "rel-offset:0.5", "silent-rank:1", "crash-at-load", "http-500")


@pytest.fixture(scope="module")
def fault_servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Standin]]:
    """One server per fault, started together (their imports overlap)."""
    tmp = tmp_path_factory.mktemp("faults")
    servers = {
        fault: Standin(tmp, config={**CONFIG, "standin": {"fault": fault, "load_delay_s": 0.5}}, load_delay=1)
        for fault in FAULTS
    }
    yield servers
    for s in servers.values():
        s.stop()


def one_request(s: Standin, tokens: int = 2) -> tuple[int, object]:
    s.wait_ready()
    return s.post("/generate", {"text": "a b", "sampling_params": {"max_new_tokens": tokens}})


def steps_of(answer: object) -> int:
    assert isinstance(answer, dict)
    return int(answer["meta_info"]["spec_verify_ct"])


def test_fault_nan(fault_servers: dict[str, Standin]) -> None:
    status, answer = one_request(fault_servers["nan"])
    assert status == 200
    rels = [rel for _, rel, _, _ in parity_lines(fault_servers["nan"].settled_lines())]
    assert len(rels) == steps_of(answer) * 2 * 2 and all(math.isnan(rel) for rel in rels)


def test_fault_rel_offset(fault_servers: dict[str, Standin]) -> None:
    status, answer = one_request(fault_servers["rel-offset:0.5"])
    assert status == 200
    rels = [rel for _, rel, _, _ in parity_lines(fault_servers["rel-offset:0.5"].settled_lines())]
    assert len(rels) == steps_of(answer) * 4 and all(0.5 <= rel < 0.51 for rel in rels)


def test_fault_silent_rank(fault_servers: dict[str, Standin]) -> None:
    status, answer = one_request(fault_servers["silent-rank:1"])
    assert status == 200
    lines = parity_lines(fault_servers["silent-rank:1"].settled_lines())
    assert len(lines) == steps_of(answer) * 2 and {tp for _, _, tp, _ in lines} == {0}


def test_fault_crash_at_load(fault_servers: dict[str, Standin]) -> None:
    s = fault_servers["crash-at-load"]
    s.wait_started()  # it listened (503) while "loading", then crashed
    assert s.proc.wait(timeout=60) == 1
    assert any("simulated crash at model load" in line for line in s.lines)


def test_fault_http_500(fault_servers: dict[str, Standin]) -> None:
    s = fault_servers["http-500"]
    status, answer = one_request(s)
    assert status == 500 and "http-500" in answer["error"]["message"]  # type: ignore[index]
    assert s.post("/v1/completions", {"prompt": "a"})[0] == 500
    assert s.get("/health")[0] == 200
    assert s.get("/health_generate")[0] == 503
    assert s.kdtree_lines() == []


def test_unknown_fault_is_refused_at_start(tmp_path: Path) -> None:
    s = Standin(tmp_path, config={"standin": {"fault": "meltdown"}})
    assert s.proc.wait(timeout=60) == 2
    s.stop()
    assert any("standin.fault must be one of" in line for line in s.lines)


def test_classic_bug_release_fails_parity_when_served(tmp_path: Path) -> None:
    """The seed's bug needs no knob: the stand-in runs the release's marshal.py for real."""
    root = buggy_release("drafts", tmp_path)
    s = Standin(tmp_path, config=CONFIG, load_delay=0, tp=1, root=root)
    try:
        assert one_request(s, tokens=1)[0] == 200
        rels = [rel for _, rel, _, _ in parity_lines(s.settled_lines())]
        assert rels and min(rels) > 0.5, rels
    finally:
        s.stop()


def test_metrics_serve_the_running_requests_in_prometheus_text(server: Standin) -> None:
    """SGLang's /metrics (--enable-metrics): no API key needed, sglang:num_running_reqs counts requests being
    decoded (1 while a streamed answer is open), the counters add up what was served."""
    ready(server)

    def metrics() -> dict[str, float]:
        status, ctype, raw = server.get("/metrics")
        assert status == 200 and ctype.startswith("text/plain")
        values = {}
        for line in raw.decode().splitlines():
            if line and not line.startswith("#"):
                name_labels, value = line.rsplit(" ", 1)
                assert name_labels.endswith('{model_name="kdtree-standin"}'), line
                values[name_labels.split("{", 1)[0]] = float(value)
        return values

    before = metrics()
    assert before["sglang:num_running_reqs"] == 0
    body = {"input_ids": [3, 4], "sampling_params": {"max_new_tokens": 64}, "stream": True}
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    conn.request("POST", "/generate", json.dumps(body).encode(), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.readline().startswith(b"data: ")  # the first verify step is done, the request still runs
    during = metrics()
    resp.read()
    conn.close()
    after = metrics()
    assert during["sglang:num_running_reqs"] == 1
    assert after["sglang:num_running_reqs"] == 0
    assert after["sglang:num_requests_total"] == before["sglang:num_requests_total"] + 1
    assert after["sglang:generation_tokens_total"] == before["sglang:generation_tokens_total"] + 64
    assert after["sglang:prompt_tokens_total"] == before["sglang:prompt_tokens_total"] + 2


def test_too_long_a_request_is_400_before_any_step(server: Standin) -> None:
    ready(server)
    before = verify_steps(server)
    status, answer = server.post("/generate", {"input_ids": [1] * 5000, "sampling_params": {"max_new_tokens": 4000}})
    assert status == 400 and "context length" in answer["error"]["message"]
    assert verify_steps(server) == before
