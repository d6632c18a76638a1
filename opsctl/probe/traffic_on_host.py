"""The gate's verify traffic, run on the host: readiness polls, probe waves and the comparison workload against the
service's own HTTP API on the host's loopback (docs/gate.md "The probe", "The comparison workload").

This module is the program's entry (the configuration's check, ``run``, ``main``); the rest of it is in the
modules it imports: ``envfile`` (the API key), ``budget`` (the time budget and the scheduler), ``stream`` (one
request and its answer stream), ``readings`` (load and host calibration) and ``modes``. opsctl ships them to the
host as one text (opsctl/probe/traffic.py: ``TRAFFIC_PROGRAM``, opsctl/ssh/hostprogram.py), as ``python3 -``, on
stdin, with the configuration (JSON) written into the ``CONFIG_TEXT`` line: nothing of it is in argv, where ``ps``
shows it and the kernel caps one argument at 128 KiB. The operator's machine never reaches the service port, and the host
needs only its own python3 (stdlib: http.client, threading), not the service's venv. It prints one JSON document
on stdout and exits 0; exit 2 means the configuration was unusable. The configuration carries no secret: an API
key is read here, from the service's environment file (as systemd reads it), and never printed (only whether one
was sent, or why not).

Modes (``mode`` in the config):
- ``ready``: GET ``ready_path`` until it answers 200 or ``wait_s`` has passed -> ``{"ready", "status", "error",
  "polls", "elapsed_s"}``;
- ``wave``: ``requests`` streaming greedy requests to ``endpoint``, ``concurrency`` at a time, each with its own
  request id ``<rid_prefix>-<n>`` -> ``{"requests": [{"rid", "ok", "kind", "status", "error", "ttft_s",
  "latency_s", "tokens"}], "unsent", "auth", "auth_error", "elapsed_s"}``. ``kind``: ``ok``, ``http`` (a status
  other than 200), ``timeout``, ``connection`` (refused, reset), ``malformed`` (an answer not shaped like
  SGLang's), ``error`` (an error object inside the stream) or ``cut`` (cut short by the gate's deadline before
  ``timeout_s``: not a failure);
- ``compare``: the comparison workload: ``warmup`` requests (discarded), then one request per prompt ->
  ``{"sample": {"requests": [...], "load_source"}, "warmup": {"sent", "failed"}, "unsent", "auth", ...}``, each
  request in the form of opsctl/comparison/sample.py.

Budgets (``wave`` and ``compare``): no request starts after ``start_within_s`` (so the gate reads the journal
between requests) or with less than ``min(timeout_s, MIN_REQUEST_S)`` left, and none runs past
``finish_within_s`` (the gate's deadline); the requests not sent are counted in ``unsent``.

Kept to the standard library and to the Python of older hosts (3.10: the first whose socket timeouts are
TimeoutError): no third-party import, no match statement.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from .envfile import read_env_value
from .modes import compare, wait_ready, wave

REQUIRED = {
    "ready": ("host", "port", "ready_path", "wait_s"),
    "wave": ("host", "port", "endpoint", "rid_prefix", "requests", "max_new_tokens", "timeout_s"),
    "compare": ("host", "port", "endpoint", "rid_prefix", "max_new_tokens", "timeout_s"),
}
NUMBERS = ("port", "wait_s", "requests", "concurrency", "max_new_tokens", "timeout_s", "first", "warmup")
BUDGETS = ("start_within_s", "finish_within_s")


def check_levels(cfg: dict[str, Any]) -> dict[str, Any]:
    """A ``compare`` with a list of concurrency levels (issue 48): the list checked and moved to ``levels``."""
    value = cfg.get("concurrency")
    if cfg["mode"] != "compare" or not isinstance(value, list):
        return cfg
    if not value or any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in value):
        raise ValueError("concurrency must be a number or a list of positive integers")
    return dict(cfg, levels=value, concurrency=None)


def check_number(cfg: dict[str, Any], key: str) -> None:
    """``key``, when given (and not null), is a number that is not negative; ValueError otherwise."""
    value = cfg.get(key)
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{key} must be a number")
    if value < 0:
        raise ValueError(f"{key} must not be negative")


def check_config(cfg: Any) -> dict[str, Any]:
    """The configuration as opsctl sends it, or ValueError: the operator validated it (inventory limits); this
    is the host's own check that it got what it expects (numbers that are numbers, a prompt list)."""
    if not isinstance(cfg, dict):
        raise ValueError("the configuration must be a JSON object")
    mode = cfg.get("mode")
    if mode not in REQUIRED:
        raise ValueError(f"mode must be one of {', '.join(sorted(REQUIRED))}, not {mode!r}")
    missing = [k for k in REQUIRED[mode] if k not in cfg]
    if missing:
        raise ValueError("missing config key(s): " + ", ".join(missing))
    cfg = check_levels(cfg)
    for key in NUMBERS + BUDGETS:
        check_number(cfg, key)
    if mode != "ready" and not cfg.get("input_ids") and not cfg.get("prompts"):
        raise ValueError(f"a {mode} needs prompts or input_ids")
    return cfg


def run(cfg: dict[str, Any]) -> dict[str, Any]:
    """One invocation: the config -> the JSON document to print."""
    cfg = check_config(cfg)
    api_key, auth_error = read_env_value(cfg.get("env_file"), cfg.get("api_key_env") or "SGLANG_API_KEY")
    t0 = time.monotonic()
    mode = cfg["mode"]
    if mode == "ready":
        out = wait_ready(cfg, api_key)
    elif mode == "wave":
        requests, unsent = wave(cfg, api_key, t0)
        out = {"requests": requests, "unsent": unsent}
    else:
        out = compare(cfg, api_key, t0)
    out.update(auth=api_key is not None, auth_error=auth_error, elapsed_s=time.monotonic() - t0)
    return out


# opsctl replaces this line with the configuration (JSON text, as a string literal) when it ships the program on
# stdin (opsctl/ssh/hostprogram.py: HostProgram.payload): the configuration never goes in argv, where `ps` shows
# it and the kernel caps one argument at 128 KiB.
CONFIG_TEXT: str | None = None


def main(config_text: str | None) -> int:
    try:
        if not config_text:
            raise ValueError("no configuration (opsctl ships it with the program, on stdin)")
        out = run(json.loads(config_text))
    except (ValueError, KeyError, TypeError) as e:
        print(json.dumps({"config_error": str(e)}))
        return 2
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    # By hand, where opsctl is installed: `python3 -m opsctl.probe.traffic_on_host < config.json`.
    sys.exit(main(CONFIG_TEXT if CONFIG_TEXT is not None else sys.stdin.read()))
