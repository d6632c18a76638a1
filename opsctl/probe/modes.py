"""The probe program's modes on the host: ``ready`` (poll the readiness path), ``wave`` (probe requests) and
``compare`` (the comparison workload, in the sample's form of opsctl/comparison/sample.py).

Part of the probe's host program (opsctl/probe/traffic_on_host.py): standard library only, Python 3.10.
"""

from __future__ import annotations

import http.client
import time
from typing import Any

from .budget import in_budget
from .readings import calibrate, get_load
from .stream import headers, send_one, shortened

PROBE_KEYS = ("rid", "ok", "kind", "status", "error", "ttft_s", "latency_s", "tokens")


def wave(cfg: dict[str, Any], api_key: str | None, t0: float | None = None) -> tuple[list[dict[str, Any]], int]:
    """``requests`` probe requests, ``concurrency`` at a time, numbered from ``first``, within the budget ->
    (the requests sent, in order; how many were not sent)."""
    first = int(cfg.get("first", 0))
    numbers = list(range(first, first + int(cfg["requests"])))
    sent, unsent = in_budget(
        cfg, numbers, lambda n, finish_by: send_one(cfg, n, api_key, finish_by), t0 or time.monotonic()
    )
    return [{k: r[k] for k in PROBE_KEYS} for r in sent], unsent


def _finite(value: Any, integer: bool = False) -> Any:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if integer:
        return value if isinstance(value, int) and value >= 0 else None
    return float(value) if value == value and abs(value) != float("inf") and value >= 0 else None


def compare_record(rec: dict[str, Any], load: float | None) -> dict[str, Any]:
    """One measured request in the sample's form (opsctl/comparison/sample.py), from the times this program saw the
    chunks: TTFT to the first chunk carrying tokens, decode seconds per token after it (to the last one)."""
    meta = rec.get("meta") or {}
    ids = rec.get("output_ids") or []
    completion = _finite(meta.get("completion_tokens"), integer=True)
    decode = decode_s = None
    first, last, ttft = rec.get("first_tokens"), rec.get("last_s"), rec.get("first_token_s")
    if rec["ok"] and first is not None and last is not None and ttft is not None and len(ids) > first:
        decode_s = last - ttft
        decode = decode_s / (len(ids) - first)
    return {
        "output_ids": ids if rec["ok"] else [],
        "decode_s_per_token": decode,
        "ttft_s": ttft if rec["ok"] else None,
        "spec_accept_length": _finite(meta.get("spec_accept_length")),
        "spec_verify_ct": _finite(meta.get("spec_verify_ct"), integer=True),
        "completion_tokens": completion if completion is not None else len(ids),
        "load": load,
        "host_s": rec.get("host_s"),
        "status": rec["status"],
        "error": rec["error"],
        "decode_s": decode_s,
        "concurrency": rec.get("concurrency"),
    }


def levels(cfg: dict[str, Any]) -> list[int]:
    """The workload's concurrency levels: ``concurrency`` is one number or a list of them (issue 48)."""
    value = cfg.get("levels") or cfg.get("concurrency") or 1
    return [max(1, int(v)) for v in value] if isinstance(value, list) else [max(1, int(value))]


def compare(cfg: dict[str, Any], api_key: str | None, t0: float) -> dict[str, Any]:
    """The comparison workload: ``warmup`` requests first (answers discarded, failures counted), then at each
    concurrency level in turn one request per prompt (or token-id list), in order, that many at a time; each
    measured request with the server's load read just before and just after it (their mean), when ``/metrics``
    has it, and the level it was sent at."""
    count = len(cfg.get("input_ids") or cfg["prompts"])
    warmup = int(cfg.get("warmup", 0))
    with_load = get_load(cfg, api_key) is not None
    sent: list[dict[str, Any]] = []
    unsent = 0
    for k, level in enumerate(levels(cfg)):
        first = warmup + k * count
        jobs = [(n, n % count, False) for n in range(warmup if k == 0 else 0)]
        jobs += [(first + i, i, True) for i in range(count)]
        records, left = compare_level(dict(cfg, concurrency=level), api_key, t0, jobs, with_load)
        sent += [dict(r, concurrency=level) for r in records]
        unsent += left
    warm = [r for r in sent if not r["measured"]]
    return {
        "sample": {
            "requests": [compare_record(r, r["load"]) for r in sent if r["measured"]],
            "load_source": "metrics" if with_load else None,
        },
        "warmup": {"sent": len(warm), "failed": sum(1 for r in warm if not r["ok"])},
        "unsent": unsent,
    }


def compare_level(
    cfg: dict[str, Any], api_key: str | None, t0: float, jobs: list[tuple[int, int, bool]], with_load: bool
) -> tuple[list[dict[str, Any]], int]:
    """The jobs of one level, ``concurrency`` at a time -> (the records sent, in order; how many were not sent)."""

    def send(job: tuple[int, int, bool], finish_by: float | None) -> dict[str, Any]:
        n, index, measured = job
        before = get_load(cfg, api_key) if with_load and measured else None
        host_before = calibrate() if measured else None
        rec = send_one(cfg, n, api_key, finish_by, index)
        # Timed on both sides of the request: contention that comes and goes within a request is seen twice as often.
        rec["host_s"] = (host_before + calibrate()) / 2 if host_before is not None else None
        after = get_load(cfg, api_key) if with_load and measured else None
        loads = [v for v in (before, after) if v is not None]
        rec["measured"], rec["load"] = measured, (sum(loads) / len(loads) if loads else None)
        return rec

    return in_budget(cfg, jobs, send, t0)


# ------------------------------------------------------------------------------------------------ readiness


def get_status(cfg: dict[str, Any], api_key: str | None, timeout: float) -> tuple[int | None, str | None]:
    """GET ``ready_path`` -> (HTTP status or None, error or None)."""
    conn = http.client.HTTPConnection(cfg["host"], int(cfg["port"]), timeout=timeout)
    try:
        conn.request("GET", cfg["ready_path"], headers=headers(api_key, body=False))
        resp = conn.getresponse()
        resp.read(8192)
        return resp.status, None
    except TimeoutError:
        return None, f"no answer within {timeout:g}s"
    except (ConnectionError, http.client.HTTPException, OSError) as e:
        return None, f"{type(e).__name__}: {shortened(str(e))}"
    finally:
        conn.close()


def wait_ready(
    cfg: dict[str, Any], api_key: str | None, sleep: Any = time.sleep, clock: Any = time.monotonic
) -> dict[str, Any]:
    """Poll ``ready_path`` every ``interval_s`` until it answers 200 or ``wait_s`` has passed."""
    t0 = clock()
    wait_s, interval = float(cfg["wait_s"]), float(cfg.get("interval_s", 0.25))
    status, error, polls = None, None, 0
    while True:
        polls += 1
        left = max(0.2, wait_s - (clock() - t0))
        status, error = get_status(cfg, api_key, min(5.0, left))
        if status == 200:
            break
        if clock() - t0 + interval > wait_s:
            break
        sleep(interval)
    return {"ready": status == 200, "status": status, "error": error, "polls": polls, "elapsed_s": clock() - t0}
