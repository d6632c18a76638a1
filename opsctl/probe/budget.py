"""The probe's time budget on the host: how long a request may run before the gate's deadline, which requests
start at all, and ``in_budget``, the scheduler that sends jobs ``concurrency`` at a time within it.

Part of the probe's host program (opsctl/probe/traffic_on_host.py): standard library only, Python 3.10. The
operator's side asks ``request_time_s`` too (opsctl/probe/traffic.py: ``worth_a_wave``).
"""

from __future__ import annotations

import threading
import time
from typing import Any

# The least time a request is started with (or ``timeout_s``, when that is shorter): one started closer to the gate's
# deadline would be cut short by it, and an answer the gate did not wait for says nothing about the release.
MIN_REQUEST_S = 1.0


def request_time_s(timeout_s: float, left_s: float | None) -> float | None:
    """How long a request started now may run: ``timeout_s``, or the time ``left_s`` to the gate's deadline when
    that is shorter. None: do not start it (it is counted unsent), less than ``min(timeout_s, MIN_REQUEST_S)`` is
    left. Pure."""
    if left_s is None:
        return timeout_s
    if left_s < min(timeout_s, MIN_REQUEST_S):
        return None
    return min(timeout_s, left_s)


def cut_by_deadline(kind: str, allowed_s: float, timeout_s: float) -> bool:
    """Whether a request that ended as ``kind`` was cut short by the gate's own deadline rather than failed: it ran
    out of time, and its limit ``allowed_s`` was the deadline's, shorter than ``timeout_s``. Such a request is not
    a failure of the release (nor an answer): the gate counts it unsent. Pure."""
    return kind == "timeout" and allowed_s < timeout_s


def in_budget(cfg: dict[str, Any], jobs: list[Any], send: Any, t0: float) -> tuple[list[dict[str, Any]], int]:
    """``send(job, finish_by)`` for each job, ``concurrency`` at a time, in job order. No job starts after
    ``start_within_s`` (the gate regains control and reads the journal between requests) or with less than
    ``request_time_s``'s minimum left before ``finish_within_s`` (the gate's deadline); a started one gives up at
    that deadline. -> (the records of the jobs sent, how many were not sent)."""
    start_within = cfg.get("start_within_s")
    finish_within = cfg.get("finish_within_s")
    finish_by = None if finish_within is None else t0 + float(finish_within)
    start_by = None if start_within is None else t0 + float(start_within)
    timeout_s = float(cfg["timeout_s"])
    workers = max(1, min(int(cfg.get("concurrency") or 1), len(jobs) or 1))
    lock = threading.Lock()
    queue = list(enumerate(jobs))
    records: dict[int, dict[str, Any]] = {}

    def worker() -> None:
        while True:
            with lock:
                now = time.monotonic()
                if not queue or (start_by is not None and now >= start_by):
                    return
                if finish_by is not None and request_time_s(timeout_s, finish_by - now) is None:
                    return
                i, job = queue.pop(0)
            records[i] = send(job, finish_by)

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    sent = [records[i] for i in sorted(records)]
    return sent, len(jobs) - len(sent)
