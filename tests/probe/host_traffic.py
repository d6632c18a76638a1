"""Requests to a testbed host's stand-in server, sent on the host itself: the gate's own probe program
(opsctl/traffic.py) over SSH, so the traffic stays on the host's loopback. Idle, the stand-in verifies nothing and
prints no line; a test that needs verify calls without a deploy (captures, logs) sends these."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from opsctl.inventory import HostConfig
from opsctl.probe.traffic import ProbeClient
from opsctl.ssh import connect


@contextmanager
def traffic(host: HostConfig, max_new_tokens: int = 2, pause_s: float = 0.3) -> Iterator[list[int]]:
    """While the block runs, one request of ``max_new_tokens`` tokens after another (``pause_s`` apart). Yields a
    one-item list: the number of requests answered so far."""
    answered = [0]
    stop = threading.Event()
    errors: list[BaseException] = []

    def loop() -> None:
        try:
            with connect(host) as r:
                client = ProbeClient(host, lambda: r, rid_prefix="opsctl-probe-test")
                ready = client.ready(60.0)
                assert ready.ready, f"{host.name}: the server was not ready: {ready.describe('/health')}"
                while not stop.is_set():
                    answered[0] += client.wave(requests=1, max_new_tokens=max_new_tokens).answered
                    stop.wait(pause_s)
        except BaseException as e:  # reported by the caller's thread below
            errors.append(e)

    thread = threading.Thread(target=loop, name=f"traffic-{host.name}", daemon=True)
    thread.start()
    try:
        yield answered
    finally:
        stop.set()
        thread.join(120)
    if errors:
        raise AssertionError(f"{host.name}: traffic failed: {errors[0]}") from errors[0]
