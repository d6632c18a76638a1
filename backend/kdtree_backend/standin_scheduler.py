"""The stand-in server's scheduler (:mod:`kdtree_backend.serve`): verify steps one at a time, the requests being
decoded in turn, each step one step of tree speculative decoding through the backend's real verify path, its
parity sampled as the backend samples, and the injected faults that change a step's speed (slow, slow-batch)."""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable

import torch

from .config import KdtreeConfig, ParityConfig
from .lines import OncePer, emit, format_fallback
from .metrics import LoadCounters
from .replay import DTYPES, ReplayService, ReplaySettings
from .specdecode import RequestState, SpeculativeDecoder
from .standin import Generated, GenerateRequest, fault_line, fault_parity
from .verify import kernel_usable


class TurnLock:
    """A lock taken in the order it was asked for (first come, first served): the requests being decoded take their
    verify steps in turn, one step each, as a batching server's step serves every running request once. A plain
    ``threading.Lock`` lets the thread that just released it take it again at once, so one request could run many
    steps while the others wait, and each request's decode time at 8 concurrent requests swung with that order
    (per-prompt log ratios 0.14-0.39 apart between two samples of the same release on the testbed)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._queue: collections.deque[object] = collections.deque()
        self._held = False

    def __enter__(self) -> None:
        me = object()
        with self._cond:
            self._queue.append(me)
            while self._held or self._queue[0] is not me:
                self._cond.wait()
            self._queue.popleft()
            self._held = True

    def __exit__(self, *exc: object) -> None:
        with self._cond:
            self._held = False
            self._cond.notify_all()


class Scheduler:
    """Runs verify steps one at a time (the server's scheduler), the requests in turn (:class:`TurnLock`): each is
    one step of tree speculative decoding of one request, one verify call per layer on every rank
    (:class:`SpeculativeDecoder`)."""

    def __init__(self, config: KdtreeConfig, tp_size: int, device: torch.device, seed: int = 0) -> None:
        r = config.replay
        settings = ReplaySettings(
            steps=0, interval_s=0.0, bs=1, prefix=r.prefix, q_len=r.q_len, heads=r.heads, layers=r.layers,
            every_n_steps=1, device=str(device), dtype=r.dtype, tree=r.tree, seed=seed, threshold=None,
            tp_size=tp_size,
        )  # fmt: skip
        self.usable, self.fallback_reason = kernel_usable(device)
        fault = config.standin.fault
        split_seen: set[int] = set()  # split-line: the ranks whose line was cut already
        self.service = ReplayService(
            settings,
            device,
            use_kernel=self.usable,
            capture=True,
            parity_filter=lambda rank, stats: fault_parity(fault, rank, stats),
            sink=lambda line: emit(fault_line(fault, line, split_seen)),
        )
        self.decoder = SpeculativeDecoder(
            self.service,
            q_len=r.q_len,
            dtype=DTYPES[r.dtype],
            seed=seed,
            common_mode=fault is not None and fault.kind == "common-mode",
        )
        self.slow_factor = fault.value if fault is not None and fault.kind == "slow" else 1.0
        # slow-batch:F: a verify step F times as long while 2 or more requests are being decoded (a kernel whose
        # plan is slower at larger batches); one request alone decodes at full speed.
        self.batch_factor = fault.value if fault is not None and fault.kind == "slow-batch" else 1.0
        self.parity: ParityConfig = config.parity
        self.lock = TurnLock()
        self.steps = 0
        self.load = LoadCounters()
        self._fallback = OncePer()

    def verify_step(self, state: RequestState) -> None:
        """One verify step of ``state`` (global step count, parity sampled on it as the backend samples)."""
        with self.lock:
            index = self.steps
            self.steps += 1
            if not self.usable:  # said at the first step, not at start: idle, the server prints no [kdtree] line
                self._fallback("fallback", lambda: format_fallback(self.fallback_reason, path="reference"))
            layers = [layer for layer in self.service.settings.layers if self.parity.wants(index, layer)]
            started = time.perf_counter()
            with torch.inference_mode():
                self.decoder.step([state], index, layers)
            factor = self.slow_factor
            if self.batch_factor > 1.0 and self.load.running_reqs >= 2:  # standin.fault slow-batch:F
                factor = self.batch_factor
            if factor > 1.0:  # standin.fault slow:F, a verify step F times as long
                # Busy, as a slower kernel is: a sleep would give the processor up, and waking up on a loaded host
                # costs far more than the sleep (slow:1.5 measured 0.28x on the testbed with time.sleep).
                until = started + factor * (time.perf_counter() - started)
                while time.perf_counter() < until:
                    pass

    def generate(self, request: GenerateRequest, on_token: Callable[[Generated], bool] | None = None) -> Generated:
        """Decode ``request``; ``on_token`` sees the partial result after each verify step (False: client gone).
        Raises :class:`ContextTooLong` (before any step) for a request that cannot fit the KV pool."""
        started = time.monotonic()
        want = request.max_new_tokens
        if want == 0:
            return Generated(request, (), 0, started)
        with self.load.waiting():
            state = self.decoder.start(request.prompt_ids, want)
        try:
            with self.load.running():
                while len(state.generated) < want:
                    self.verify_step(state)
                    output = tuple(state.generated[:want])
                    partial = Generated(request, output, state.verify_ct, started, finished=False)
                    if on_token is not None and len(output) < want and not on_token(partial):
                        break
        finally:
            self.decoder.finish(state)
        output = tuple(state.generated[:want])
        self.load.served(len(request.prompt_ids), len(output), state.verify_ct)
        return Generated(request, output, state.verify_ct, started)
