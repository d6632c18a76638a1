"""The stand-in for SGLang on testbed hosts: an HTTP server shaped like SGLang 0.5.23 whose decode steps run the
backend's real verify path on CPU and print the server's ``[kdtree]`` lines (docs/testbed.md).

    PYTHONPATH=<release>/kernel:<release>/backend python3 -m kdtree_backend.serve --port 30000 --tp-size 2 \\
        [--load-delay 3] [--host 127.0.0.1]

* ``/health`` and ``/ready`` answer 503 until the model-load delay has passed, then 200.
* ``/generate``, ``/v1/completions`` (plain and streamed) and ``/health_generate`` decode by tree speculative
  decoding (:mod:`kdtree_backend.specdecode`): a tiny seeded model whose attention is the backend's verify path,
  an n-gram drafter, greedy acceptance. Each verify step is one verify call per layer and TP rank through
  :meth:`kdtree_backend.replay.ReplayService.verify_layer` (SGLang-shaped metadata, ``marshal.py``, the reference
  attention; on sampled steps the independent dense check and a parity line), sampled as the real backend samples
  (``parity.burst_steps`` after the start, then ``parity.every_n_steps``). ``meta_info`` carries
  ``completion_tokens``, ``spec_verify_ct`` (verify steps), ``spec_accept_length`` (completion_tokens /
  spec_verify_ct) and ``e2e_latency`` as SGLang 0.5.23's. One scheduler lock serves the steps of all requests in
  turn, so the step count is global, as in the server (:mod:`kdtree_backend.standin_scheduler`).
* ``/metrics``: Prometheus text with SGLang's names (``sglang:num_running_reqs`` ...), no API key needed.
* Idle it prints nothing; there is no timer.
* ``$SGLANG_API_KEY`` (``--api-key-env``), when set, is required as ``Authorization: Bearer`` on every endpoint
  but ``/health`` and ``/metrics``, as SGLang's ``--api-key`` does.
* Every line it prints is one write of the whole line (:func:`kdtree_backend.lines.write_line`): a served-request
  line and a parity line from another thread never reach journald glued into one message.
* ``standin.fault`` in deploy/kdtree.json injects a failure: nan, rel-offset:X, silent-rank:R, split-line:R (rank
  R's first parity line fails, padded so that journald cuts it inside its token), crash-at-load,
  http-500, slow:F (every verify step F times as long), slow-batch:F (F times as long while 2 or more requests
  are being decoded: a kernel slower only at larger batches), common-mode (a wrong ``sm_scale`` in the verify metadata,
  read by the kernel path and the reference alike: parity passes, the answers change). ``standin.load_delay_s``
  is the load delay (``--load-delay`` wins).
"""

from __future__ import annotations

import argparse
import hmac
import json
import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import torch

from .config import ConfigError, KdtreeConfig, StandinFault, load_config
from .lines import write_line
from .metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from .replay import exit_without_teardown, resolve_device, stop_on_signals
from .specdecode import CONTEXT_LEN, ContextTooLong
from .standin import (
    SGLANG_VERSION,
    BadRequest,
    GenerateCall,
    Generated,
    GenerateRequest,
    completion_chunk,
    completion_response,
    detokenize,
    error_body,
    generate_item,
    parse_completions,
    parse_generate,
    sse,
)
from .standin_scheduler import Scheduler

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
MAX_BODY = 1 << 20
PREFIX = "kdtree-standin:"


@dataclass(frozen=True)
class ServeOptions:
    host: str
    port: int
    tp_size: int
    load_delay_s: float
    device: str
    model_path: str
    api_key_env: str
    skip_tokenizer_init: bool
    seed: int = 0


@dataclass
class ServerState:
    options: ServeOptions
    config: KdtreeConfig
    scheduler: Scheduler
    api_key: str | None
    loaded: threading.Event = field(default_factory=threading.Event)

    @property
    def fault(self) -> StandinFault | None:
        return self.config.standin.fault

    def server_info(self) -> dict[str, Any]:
        o = self.options
        return {
            "version": SGLANG_VERSION,
            "model_path": o.model_path,
            "tp_size": o.tp_size,
            "port": o.port,
            "host": o.host,
            "attention_backend": "kdtree",
            "speculative_algorithm": "DDTREE",
            "speculative_num_draft_tokens": self.config.replay.q_len,
            "page_size": 1,
            "context_length": CONTEXT_LEN,
            "enable_metrics": True,
            "skip_tokenizer_init": o.skip_tokenizer_init,
            "load_delay_s": o.load_delay_s,
            "standin": True,
            "device": str(self.scheduler.service.device),
            "verify_steps": self.scheduler.steps,
        }


class Handler(BaseHTTPRequestHandler):
    server_version = f"kdtree-standin/{SGLANG_VERSION}"
    state: ServerState  # set on the subclass made by make_server
    _streaming = False  # the answer's status and headers are out (a stream)

    # ---- plumbing ----------------------------------------------------------------------------------
    def log_message(self, format: str, *args: Any) -> None:
        """No access log: idle (health polls) the server prints nothing; requests are logged when served."""

    def _send(self, status: int, body: dict[str, Any] | list[Any] | None = None) -> None:
        data = b"" if body is None else json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _error(self, status: int, message: str) -> None:
        self._send(status, error_body(message, status))

    def _authorized(self) -> bool:
        key = self.state.api_key
        if not key:
            return True
        given = self.headers.get("Authorization", "")
        return hmac.compare_digest(given.encode(), f"Bearer {key}".encode())

    def _gate(self, *, needs_key: bool = True) -> bool:
        """False (answered already) when the key is missing or wrong, or the model is still loading."""
        if needs_key and not self._authorized():
            self._send(401, {"error": "Unauthorized"})  # SGLang's api-key middleware answer
            return False
        if not self.state.loaded.is_set():
            self._send(503)
            return False
        return True

    def _body(self) -> bytes:
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            raise BadRequest("Content-Length is not a number") from None
        if not 0 <= length <= MAX_BODY:
            raise BadRequest(f"the request body must be at most {MAX_BODY} bytes")
        return self.rfile.read(length)

    def _start_stream(self) -> None:
        self._streaming = True
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()

    def _chunk(self, data: bytes) -> bool:
        try:
            self.wfile.write(data)
            self.wfile.flush()
            return True
        except (BrokenPipeError, ConnectionResetError):
            return False

    def _served(self, results: Sequence[Generated]) -> None:
        for r in results:
            write_line(
                f"{PREFIX} served rid={r.request.rid} prompt_tokens={len(r.request.prompt_ids)} "
                f"completion_tokens={len(r.output_ids)} spec_verify_ct={r.steps} "
                f"e2e_latency={time.monotonic() - r.started:.3f}s"
            )

    def _fits(self, call: GenerateCall) -> bool:
        """False (answered 400 already) when a prompt and its max_new_tokens exceed the context length."""
        for request in call.requests:
            try:
                self.state.scheduler.decoder.check(request.prompt_ids, request.max_new_tokens)
            except ContextTooLong as exc:
                self._error(400, str(exc))
                return False
        return True

    # ---- endpoints ---------------------------------------------------------------------------------
    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path in ("/health", "/ready"):
            if self._gate(needs_key=path != "/health"):
                self._send(200)
        elif path == "/health_generate":
            if self._gate():
                if self.state.fault is not None and self.state.fault.kind == "http-500":
                    self._send(503)
                    return
                request = GenerateRequest(f"HEALTH_CHECK_{time.time_ns()}", (1,), 1)
                self._served([self.state.scheduler.generate(request)])
                self._send(200)
        elif path == "/metrics":  # served during the load too and, as SGLang's, without the API key
            data = self.state.scheduler.load.prometheus(self.state.options.model_path).encode()
            self.send_response(200)
            self.send_header("Content-Type", METRICS_CONTENT_TYPE)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        elif path in ("/get_server_info", "/server_info"):
            if self._gate():
                self._send(200, self.state.server_info())
        elif path == "/v1/models":
            if self._gate():
                self._send(200, {"object": "list", "data": [{"id": self.state.options.model_path, "object": "model"}]})
        else:
            self._error(404, f"no route GET {path}")

    def do_POST(self) -> None:
        path = self.path.split("?", 1)[0]
        if path not in ("/generate", "/v1/completions"):
            self._error(404, f"no route POST {path}")
            return
        if not self._gate():
            return
        skip = self.state.options.skip_tokenizer_init
        try:
            body = self._body()
            if path == "/generate":
                call, model = parse_generate(body, skip_tokenizer_init=skip), ""
            else:
                call, model = parse_completions(body, skip_tokenizer_init=skip)
        except BadRequest as exc:
            self._error(400, str(exc))
            return
        if self.state.fault is not None and self.state.fault.kind == "http-500":
            self._error(500, "simulated failure of the generation (standin.fault http-500)")
            return
        if not self._fits(call):
            return
        self._streaming = False
        try:
            if path == "/generate":
                self._generate(call)
            else:
                self._completions(call, model)
        except Exception as exc:  # a failed generation is answered 500 and said in one line, never a dropped socket
            write_line(f"{PREFIX} request failed: {type(exc).__name__}: {exc}", stderr=True)
            if not self._streaming:
                self._error(500, f"the generation failed: {type(exc).__name__}: {exc}")

    def _generate(self, call: GenerateCall) -> None:
        scheduler, with_text = self.state.scheduler, not self.state.options.skip_tokenizer_init
        if not call.stream:
            results = [scheduler.generate(request) for request in call.requests]
            self._served(results)
            items = [generate_item(r, with_text=with_text) for r in results]
            self._send(200, items if call.batched else items[0])
            return
        self._start_stream()
        result = scheduler.generate(
            call.requests[0], lambda partial: self._chunk(sse(generate_item(partial, with_text=with_text)))
        )
        self._served([result])
        if self._chunk(sse(generate_item(result, with_text=with_text))):
            self._chunk(sse("[DONE]"))

    def _completions(self, call: GenerateCall, model: str) -> None:
        scheduler, created = self.state.scheduler, int(time.time())
        if not call.stream:
            results = [scheduler.generate(request) for request in call.requests]
            self._served(results)
            self._send(200, completion_response(results, model, created))
            return
        self._start_stream()
        request = call.requests[0]
        rid = request.rid.rsplit("-", 1)[0]
        sent = [0]

        def on_token(partial: Generated) -> bool:
            new = partial.output_ids[sent[0] :]
            sent[0] = len(partial.output_ids)
            return self._chunk(sse(completion_chunk(rid, model, created, detokenize(new), None)))

        result = scheduler.generate(request, on_token)
        self._served([result])
        last = completion_chunk(rid, model, created, detokenize(result.output_ids[sent[0] :]), "length")
        if self._chunk(sse(last)):
            self._chunk(sse("[DONE]"))


def make_server(state: ServerState) -> ThreadingHTTPServer:
    handler = type("StandinHandler", (Handler,), {"state": state})
    server = ThreadingHTTPServer((state.options.host, state.options.port), handler)
    server.daemon_threads = True
    return server


# ---------------------------------------------------------------------------------------------- command line


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m kdtree_backend.serve",
        description="CPU stand-in for SGLang 0.5.23 with the kdtree backend (testbed hosts): HTTP API on --port, "
        "one verify step per decode step on every TP rank, [kdtree] lines as the server prints them.",
    )
    parser.add_argument("--port", type=int, required=True, help="HTTP port (SGLang's --port)")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--tp-size", type=int, default=1, help="tensor-parallel ranks: each prints its own lines")
    parser.add_argument(
        "--load-delay", type=float, default=None, help="seconds of model load before /health answers 200 "
        "(default: standin.load_delay_s of deploy/kdtree.json)",
    )  # fmt: skip
    parser.add_argument("--device", default="cpu", help="cpu (default), cuda, cuda:N or auto")
    parser.add_argument("--model-path", default="kdtree-standin", help="the model name /get_server_info reports")
    parser.add_argument(
        "--api-key-env", default="SGLANG_API_KEY", help="environment variable holding the API key (default "
        "SGLANG_API_KEY); when set and non-empty, requests need Authorization: Bearer <key>",
    )  # fmt: skip
    parser.add_argument("--skip-tokenizer-init", action="store_true", help="accept input_ids only, as SGLang does")
    parser.add_argument("--seed", type=int, default=0)
    return parser


def options_from_args(args: argparse.Namespace, config: KdtreeConfig) -> ServeOptions:
    if not 1 <= args.port <= 65535:
        raise ValueError(f"--port must be in 1..65535, got {args.port}")
    if not 1 <= args.tp_size <= 64:
        raise ValueError(f"--tp-size must be in 1..64, got {args.tp_size}")
    delay = config.standin.load_delay_s if args.load_delay is None else args.load_delay
    if not delay >= 0:
        raise ValueError(f"--load-delay must be >= 0, got {args.load_delay}")
    return ServeOptions(
        host=args.host, port=args.port, tp_size=args.tp_size, load_delay_s=delay, device=args.device,
        model_path=args.model_path, api_key_env=args.api_key_env, skip_tokenizer_init=args.skip_tokenizer_init,
        seed=args.seed,
    )  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    started = time.monotonic()
    try:
        config = load_config()
        options = options_from_args(build_parser().parse_args(argv), config)
        device = resolve_device(options.device)
    except (ConfigError, ValueError) as exc:
        write_line(f"{PREFIX} {exc}", stderr=True)
        return EXIT_USAGE
    if device.type == "cpu":
        torch.set_num_threads(1)  # small batches gain nothing from threads; testbed hosts share a few cores
    state = ServerState(
        options=options,
        config=config,
        scheduler=Scheduler(config, options.tp_size, device, options.seed),
        api_key=os.environ.get(options.api_key_env) or None,
    )
    try:
        server = make_server(state)
    except OSError as exc:
        write_line(f"{PREFIX} cannot listen on {options.host}:{options.port}: {exc}", stderr=True)
        return EXIT_FAILED
    stop = stop_on_signals(PREFIX)
    # Polled every 0.1 s, not the default 0.5 s: shutdown() waits for the next poll, and every restart of the unit
    # (a deploy, a rollback) waits for shutdown().
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, name="http", daemon=True)
    thread.start()
    fault = config.standin.fault
    shown = "none" if fault is None else fault.kind + (f":{fault.value:g}" if fault.kind == "slow" else "")
    write_line(
        f"{PREFIX} started on {options.host}:{options.port} tp={options.tp_size} device={device} "
        f"load_delay_s={options.load_delay_s:g} api_key={'required' if state.api_key else 'off'} "
        f"fault={shown} version={SGLANG_VERSION}"
    )
    code = EXIT_OK
    if not stop.wait(max(0.0, options.load_delay_s - (time.monotonic() - started))):
        if fault is not None and fault.kind == "crash-at-load":
            write_line(f"{PREFIX} simulated crash at model load (standin.fault crash-at-load)", stderr=True)
            code = EXIT_FAILED
        else:
            state.loaded.set()
            write_line(f"{PREFIX} ready after {time.monotonic() - started:.1f}s")
            stop.wait()
    server.shutdown()
    server.server_close()
    write_line(f"{PREFIX} stopped verify_steps={state.scheduler.steps} exit={code}")
    return code


if __name__ == "__main__":
    exit_without_teardown(main())
