"""The stand-in server's load and its ``/metrics`` page, in Prometheus' text format with SGLang's metric names
(``--enable-metrics``): ``sglang:num_running_reqs`` (requests being decoded), ``sglang:num_queue_reqs`` (waiting
for KV rows), and the token and verify-step counters. The comparison workload (docs/gate.md) reads the running
requests around each sample to judge whether two releases' speeds were measured at similar load."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class LoadCounters:
    """Thread-safe gauges and counters of the requests a server has seen."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.running_reqs = 0
        self.queued_reqs = 0
        self.requests = 0
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.verify_steps = 0

    @contextmanager
    def _gauge(self, name: str) -> Iterator[None]:
        with self._lock:
            setattr(self, name, getattr(self, name) + 1)
        try:
            yield
        finally:
            with self._lock:
                setattr(self, name, getattr(self, name) - 1)

    def waiting(self) -> AbstractContextManager[None]:
        """A request waiting to be admitted (its KV rows reserved, its prompt cached)."""
        return self._gauge("queued_reqs")

    def running(self) -> AbstractContextManager[None]:
        """A request being decoded."""
        return self._gauge("running_reqs")

    def served(self, prompt_tokens: int, generation_tokens: int, verify_steps: int) -> None:
        with self._lock:
            self.requests += 1
            self.prompt_tokens += prompt_tokens
            self.generation_tokens += generation_tokens
            self.verify_steps += verify_steps

    def prometheus(self, model_name: str) -> str:
        """The ``/metrics`` page."""
        label = '{model_name="' + model_name.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"}'
        with self._lock:
            rows = [
                ("num_running_reqs", "gauge", "The number of running requests.", self.running_reqs),
                ("num_queue_reqs", "gauge", "The number of requests in the waiting queue.", self.queued_reqs),
                ("num_requests_total", "counter", "Number of requests processed.", self.requests),
                ("prompt_tokens_total", "counter", "Number of prefill tokens processed.", self.prompt_tokens),
                ("generation_tokens_total", "counter", "Number of generation tokens.", self.generation_tokens),
                ("spec_verify_ct_total", "counter", "Number of speculative verify steps.", self.verify_steps),
            ]
        out = []
        for name, kind, help_text, value in rows:
            out += [f"# HELP sglang:{name} {help_text}", f"# TYPE sglang:{name} {kind}"]
            out.append(f"sglang:{name}{label} {float(value)}")
        return "\n".join(out) + "\n"
