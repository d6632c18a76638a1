"""What the comparison reads on the host beside its requests: the server's load (``GET /metrics``) and the host's
own calibration (a fixed piece of CPU work, timed).

Part of the probe's host program (opsctl/probe/traffic_on_host.py): standard library only, Python 3.10.
"""

from __future__ import annotations

import http.client
import time
from typing import Any

from .stream import headers

METRIC = "sglang:num_running_reqs"


def metric_value(text: str, name: str = METRIC) -> float | None:
    """The sum of ``name``'s samples in a Prometheus text exposition (one per label set: per TP rank, per
    model), None when it has none."""
    total, seen = 0.0, False
    for line in text.split("\n"):
        if not line.startswith(name):
            continue
        rest = line[len(name) :]
        if rest[:1] == "{":
            end = rest.find("}")
            if end < 0:
                continue
            rest = rest[end + 1 :]
        elif rest[:1] not in (" ", "\t"):
            continue  # another metric whose name starts with this one
        fields = rest.split()
        if not fields:
            continue
        try:
            value = float(fields[0])
        except ValueError:
            continue
        if value != value or value in (float("inf"), float("-inf")) or value < 0:
            continue
        total, seen = total + value, True
    return total if seen else None


def get_load(cfg: dict[str, Any], api_key: str | None) -> float | None:
    """The server's running requests now, from ``GET /metrics`` (SGLang with ``--enable-metrics``); None when it
    exposes none (404, no such metric, no answer within 5 s)."""
    conn = http.client.HTTPConnection(cfg["host"], int(cfg["port"]), timeout=5.0)
    try:
        conn.request("GET", "/metrics", headers=headers(api_key, body=False))
        resp = conn.getresponse()
        text = resp.read(1 << 22).decode("utf-8", "replace")
        return metric_value(text) if resp.status == 200 else None
    except (ConnectionError, http.client.HTTPException, OSError):
        return None
    finally:
        conn.close()


CALIBRATION_LOOPS = 3  # a few milliseconds of pure-Python work, the same on every host and every run


def calibrate(clock: Any = time.perf_counter) -> float:
    """Seconds a fixed piece of CPU work takes now (the comparison's host figure, opsctl/comparison/decode.py): run
    between requests, while the server is idle, it grows only when something else on the host takes the CPU."""
    started = clock()
    for _ in range(CALIBRATION_LOOPS):
        sum(i * i for i in range(20_000))
    return clock() - started
