"""The probe's host-side program (opsctl/host/traffic.py) against a tiny SGLang-shaped HTTP server in this process:
request building, the stream's reading and timing, each kind of failure, readiness, the API key from an
environment file; then the same program shipped as ``python3 - CONFIG`` through a local shell (opsctl/traffic.py's
ProbeClient), as the gate runs it on a host."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from opsctl.inventory import GateSettings, HostConfig, ProbeSettings, ServiceSettings
from opsctl.probe import envfile, stream, traffic_on_host
from opsctl.probe.answers import parse_wave
from opsctl.probe.traffic import TRAFFIC_PROGRAM, ProbeClient, plan_lines, wave_config
from tests import builders
from tests.pipeline.localremote import LocalRemote

KEY = "sk-probe-secret-123"


class Server:
    """SGLang's shapes, with one behaviour chosen per test (``mode``)."""

    def __init__(self) -> None:
        self.mode = "ok"
        self.ready_after = 0.0
        self.api_key: str | None = None
        self.metrics: str | None = None  # GET /metrics answers this (else 404)
        self.spec: dict[str, Any] = {}  # extra meta_info of /generate chunks (spec_accept_length, ...)
        self.bodies: list[dict[str, Any]] = []
        self.auth: list[str | None] = []
        self.started = time.monotonic()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None: ...

            def _json(self, status: int, doc: object) -> None:
                data = json.dumps(doc).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                if self.path == "/metrics":
                    data = (outer.metrics or "").encode()
                    self.send_response(404 if outer.metrics is None else 200)
                    self.send_header("Content-Type", "text/plain")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                    return
                loading = time.monotonic() - outer.started < outer.ready_after
                self._json(503 if loading else 200, {"ok": not loading})

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.bodies.append(body)
                outer.auth.append(self.headers.get("Authorization"))
                if outer.api_key and self.headers.get("Authorization") != f"Bearer {outer.api_key}":
                    return self._json(401, {"error": {"message": "Unauthorized"}})
                mode = outer.mode
                if mode == "500":
                    return self._json(500, {"error": {"message": "CUDA error: an illegal memory access"}})
                if mode == "json":
                    return self._json(200, {"text": " Paris", "output_ids": [1, 2], "meta_info": {"id": body["rid"]}})
                if mode == "slow":
                    time.sleep(1.5)
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                n = body.get("sampling_params", {}).get("max_new_tokens") or body.get("max_tokens") or 1
                for i in range(n):
                    if self.path == "/v1/completions":
                        chunk: dict[str, Any] = {"id": body["rid"], "choices": [{"index": 0, "text": "x"}]}
                    elif mode == "malformed":
                        chunk = {"text": "x"}  # no meta_info
                    else:
                        chunk = {"text": "x" * (i + 1), "output_ids": list(range(i + 1)), "meta_info": {
                            "id": body["rid"], "completion_tokens": i + 1, **outer.spec}}  # fmt: skip
                    if mode == "error" and i == 1:
                        chunk = {"error": {"message": "scheduler died"}}
                    self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                    self.wfile.flush()
                if mode != "no-done":
                    self.wfile.write(b"data: [DONE]\n\n")

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()


@pytest.fixture
def server() -> Iterator[Server]:
    s = Server()
    yield s
    s.httpd.shutdown()
    s.httpd.server_close()


def cfg(server: Server, **kw: Any) -> dict[str, Any]:
    base = {
        "mode": "wave",
        "host": "127.0.0.1",
        "port": server.port,
        "endpoint": "/generate",
        "prompts": ["a", "b"],
        "requests": 3,
        "concurrency": 2,
        "max_new_tokens": 4,
        "timeout_s": 5,
        "rid_prefix": "opsctl-probe-abc",
        "first": 7,
    }
    return {**base, **kw}


def test_generate_requests_are_greedy_streaming_numbered_and_cycle_the_prompts(server: Server) -> None:
    out = traffic_on_host.run(cfg(server))
    assert [r["rid"] for r in out["requests"]] == ["opsctl-probe-abc-7", "opsctl-probe-abc-8", "opsctl-probe-abc-9"]
    assert all(r["ok"] and r["kind"] == "ok" and r["tokens"] == 4 for r in out["requests"])
    assert all(0 < r["ttft_s"] <= r["latency_s"] for r in out["requests"])
    bodies = sorted(server.bodies, key=lambda b: b["rid"])
    assert [b["text"] for b in bodies] == ["b", "a", "b"]
    assert bodies[0]["sampling_params"] == {"max_new_tokens": 4, "temperature": 0} and bodies[0]["stream"] is True
    assert out["auth"] is False and server.auth == [None, None, None]


def test_token_ids_and_the_completions_endpoint(server: Server) -> None:
    out = traffic_on_host.run(cfg(server, input_ids=[[1, 2, 3]], requests=1))
    assert out["requests"][0]["ok"] and server.bodies[-1]["input_ids"] == [1, 2, 3] and "text" not in server.bodies[-1]
    out = traffic_on_host.run(cfg(server, endpoint="/v1/completions", requests=1, model="kimi"))
    body = server.bodies[-1]
    assert out["requests"][0]["ok"] and out["requests"][0]["tokens"] == 4
    assert (body["model"], body["prompt"], body["max_tokens"], body["temperature"]) == (
        "kimi",
        "b",
        4,
        0,
    )  # request 7: the second prompt


@pytest.mark.parametrize(
    ("mode", "kind", "error"),
    [
        ("500", "http", "HTTP 500: CUDA error: an illegal memory access"),
        ("malformed", "malformed", "malformed answer: no meta_info in a chunk"),
        ("no-done", "malformed", "malformed answer: the stream ended without data: [DONE]"),
        ("error", "error", "error in the answer stream: scheduler died"),
    ],
)
def test_each_failure_is_classified_with_its_reason(server: Server, mode: str, kind: str, error: str) -> None:
    server.mode = mode
    r = traffic_on_host.run(cfg(server, requests=1))["requests"][0]
    assert (r["ok"], r["kind"], r["error"]) == (False, kind, error)


def test_a_plain_json_answer_to_a_streaming_request_is_judged_by_the_same_shape(server: Server) -> None:
    server.mode = "json"
    r = traffic_on_host.run(cfg(server, requests=1))["requests"][0]
    assert r["ok"] and r["tokens"] == 2 and r["ttft_s"] is not None


def test_a_request_slower_than_its_timeout_is_a_timeout(server: Server) -> None:
    server.mode = "slow"
    r = traffic_on_host.run(cfg(server, requests=1, timeout_s=0.5))["requests"][0]
    assert (r["kind"], r["error"]) == ("timeout", "no complete answer within 0.5s")


def test_nothing_listening_is_a_connection_failure(server: Server) -> None:
    r = stream.send_one(cfg(server, port=1), 0, None)
    assert r["kind"] == "connection" and "Refused" in r["error"]


def test_readiness_waits_for_200(server: Server) -> None:
    server.ready_after = 0.6
    early = traffic_on_host.run(
        {**cfg(server), "mode": "ready", "ready_path": "/health", "wait_s": 0.2, "interval_s": 0.05}
    )
    assert early["ready"] is False and early["status"] == 503
    out = traffic_on_host.run(
        {**cfg(server), "mode": "ready", "ready_path": "/health", "wait_s": 5, "interval_s": 0.05}
    )
    assert out["ready"] is True and out["status"] == 200 and out["polls"] > 1


def test_the_api_key_comes_from_the_environment_file_and_is_never_printed(server: Server, tmp_path: Path) -> None:
    server.api_key = KEY
    env = tmp_path / "sglang.env"
    env.write_text(f'# comment\nOTHER=1\nSGLANG_API_KEY="{KEY}"\n')
    ok = traffic_on_host.run(cfg(server, requests=1, env_file=str(env)))
    assert ok["requests"][0]["ok"] and ok["auth"] is True and KEY not in json.dumps(ok)
    refused = traffic_on_host.run(cfg(server, requests=1, env_file=str(tmp_path / "missing.env")))
    assert refused["requests"][0]["error"] == "HTTP 401: Unauthorized" and refused["auth"] is False
    other = traffic_on_host.run(cfg(server, requests=1, env_file=str(env), api_key_env="OTHER"))
    assert other["auth"] is True and server.auth[-1] == "Bearer 1"


def test_env_file_syntax() -> None:
    assert envfile.read_env_value(None, "K") == (None, None)
    assert envfile.read_env_value("/nonexistent/x.env", "K") == (None, None)


def test_a_bad_configuration_exits_2_with_the_reason(capsys: pytest.CaptureFixture[str]) -> None:
    assert traffic_on_host.main(json.dumps({"mode": "dance"})) == 2
    assert "mode must be one of" in capsys.readouterr().out
    assert traffic_on_host.main("[]") == 2 and traffic_on_host.main(None) == 2 and traffic_on_host.main("") == 2
    assert traffic_on_host.main(json.dumps({"mode": "wave", "host": "h", "port": 1, "endpoint": "/generate",
                                    "rid_prefix": "p", "requests": "4", "max_new_tokens": 1, "timeout_s": 1,
                                    "prompts": ["a"]})) == 2  # fmt: skip
    assert "requests must be a number" in capsys.readouterr().out


# ------------------------------------------------------------------------------------------------ shipped


def host_for(server: Server, env_file: str | None = None, **probe: Any) -> HostConfig:
    return builders.host(
        "h1",
        gpu_arch=None,
        service={"mode": "sglang", "port": server.port, "tp": 2, "environment_file": env_file},
        gate={"probe": {"requests": 2, "max_new_tokens": 3, **probe}},
    )


def test_the_program_runs_from_stdin_through_a_shell_and_numbers_on_across_waves(
    server: Server, tmp_path: Path
) -> None:
    env = tmp_path / "sglang.env"
    env.write_text(f"SGLANG_API_KEY={KEY}\n")
    server.api_key = KEY
    host = host_for(server, str(env))
    remote = LocalRemote()
    client = ProbeClient(host, lambda: remote, rid_prefix="opsctl-probe-xyz")
    assert client.ready(wait_s=2).ready
    first, second = client.wave(), client.wave()
    assert [r.rid for r in (*first.requests, *second.requests)] == [f"opsctl-probe-xyz-{n}" for n in range(4)]
    assert first.answered == 2 and first.auth and all(r.ttft_s for r in first.requests)
    assert all(KEY not in c for c in remote.commands)  # argv carries the file's name, never the key


def test_the_command_carries_nothing_the_configuration_travels_on_stdin() -> None:
    """Issue 36 item 7: argv had the configuration (`ps` showed it; 128 KiB cap per argument)."""
    host = HostConfig(name="h1", address="127.0.0.1", gpu_arch=None)
    config = wave_config(host, "opsctl-probe-abc", 0)
    assert TRAFFIC_PROGRAM.command() == "python3 -"
    text = TRAFFIC_PROGRAM.payload(config)
    assert text.count("CONFIG_TEXT: str | None = ") == 1 and '\\"endpoint\\":\\"/generate\\"' in text


def test_parse_wave_refuses_what_is_not_an_answer() -> None:
    with pytest.raises(ValueError, match="printed nothing"):
        parse_wave("")
    with pytest.raises(ValueError, match="refused its configuration"):
        parse_wave('{"config_error": "missing config key(s): port"}')
    with pytest.raises(ValueError, match="no requests"):
        parse_wave("{}")


def test_plan_lines_name_the_key_variable_not_a_value() -> None:
    host = HostConfig(
        name="h1",
        address="127.0.0.1",
        gpu_arch=None,
        service=ServiceSettings(environment_file="/etc/kdtree-engine/sglang.env"),
    )
    text = "\n".join(plan_lines(host))
    assert "waves of 4 POST /generate" in text and "concurrency 4, max_new_tokens 8" in text
    assert "GET http://127.0.0.1:30000/health" in text and "$SGLANG_API_KEY in /etc/kdtree-engine/sglang.env" in text
    off = host.model_copy(update={"gate": GateSettings(probe=ProbeSettings(enabled=False))})
    assert "UNPROVEN" in plan_lines(off)[0]
