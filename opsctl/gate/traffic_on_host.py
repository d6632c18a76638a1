"""The gate's verify traffic, run on the host: readiness polls and probe waves against the service's own HTTP API on
the host's loopback (docs/gate.md "The probe").

opsctl ships this file's text to the host as ``python3 - CONFIG_JSON`` (the text on stdin): the operator's machine
never reaches the service port, and the host needs only its own python3 (stdlib: http.client, concurrent.futures),
not the service's venv. It prints one JSON document on stdout and exits 0; exit 2 means the configuration was
unusable. CONFIG_JSON (argv[1]) carries no secret: an API key is read here, from the service's environment file,
and never printed (only whether one was sent).

Modes (``mode`` in the config):
- ``ready``: GET ``ready_path`` until it answers 200 or ``wait_s`` has passed -> ``{"ready", "status", "error",
  "polls", "elapsed_s"}``;
- ``wave``: ``requests`` streaming greedy requests to ``endpoint``, ``concurrency`` at a time, each with its own
  request id ``<rid_prefix>-<n>`` -> ``{"requests": [{"rid", "ok", "kind", "status", "error", "ttft_s",
  "latency_s", "tokens"}], "auth", "auth_error", "elapsed_s"}``. ``kind``: ``ok``, ``http`` (a status other
  than 200), ``timeout``, ``connection`` (refused, reset), ``malformed`` (an answer not shaped like SGLang's) or
  ``error`` (an error object inside the stream).

Kept to the standard library and to the Python of older hosts (3.10: the first whose socket timeouts are
TimeoutError): no third-party import, no match statement.
"""

from __future__ import annotations

import concurrent.futures
import http.client
import json
import sys
import time
from typing import Any

ERROR_TEXT_MAX = 200


def read_env_value(path: str | None, name: str) -> tuple[str | None, str | None]:
    """``name``'s value in a systemd EnvironmentFile (``KEY=VALUE`` lines, ``#``/``;`` comments, optional quotes)
    -> (value or None, why it could not be read or None). A file that does not exist is no key (systemd's
    ``EnvironmentFile=-`` ignores it too); an unreadable one is reported without its content."""
    if not path:
        return None, None
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            text = fh.read(1 << 20)
    except FileNotFoundError:
        return None, None
    except OSError as e:
        return None, f"cannot read {path}: {e.strerror or type(e).__name__}"
    value = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        key, sep, rest = line.partition("=")
        if not sep or key.strip() != name:
            continue
        rest = rest.strip()
        if len(rest) >= 2 and rest[0] == rest[-1] and rest[0] in "\"'":
            rest = rest[1:-1]
        value = rest  # the last assignment wins, as in systemd
    return (value or None), None


def request_body(cfg: dict[str, Any], n: int) -> dict[str, Any]:
    """The JSON body of probe request ``n``: greedy (temperature 0), streaming, the n-th prompt (or token ids) in
    turn, request id ``<rid_prefix>-<n>``."""
    rid = f"{cfg['rid_prefix']}-{n}"
    ids = cfg.get("input_ids")
    prompt: Any = ids[n % len(ids)] if ids else cfg["prompts"][n % len(cfg["prompts"])]
    if cfg["endpoint"] == "/v1/completions":
        return {
            "model": cfg.get("model") or "default",
            "prompt": prompt,
            "max_tokens": cfg["max_new_tokens"],
            "temperature": 0,
            "stream": True,
            "rid": rid,
        }
    body: dict[str, Any] = {
        "sampling_params": {"max_new_tokens": cfg["max_new_tokens"], "temperature": 0},
        "stream": True,
        "rid": rid,
    }
    body["input_ids" if ids else "text"] = prompt
    return body


def headers(api_key: str | None, body: bool = True) -> dict[str, str]:
    out = {"Accept": "text/event-stream, application/json"}
    if body:
        out["Content-Type"] = "application/json"
    if api_key:
        out["Authorization"] = "Bearer " + api_key
    return out


def _short(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= ERROR_TEXT_MAX else text[: ERROR_TEXT_MAX - 3] + "..."


def error_text(body: bytes) -> str:
    """What an error answer says: SGLang's ``{"error": {"message": ...}}`` / ``{"message": ...}``, else the text."""
    text = body.decode("utf-8", "replace")
    try:
        doc = json.loads(text)
    except ValueError:
        return _short(text)
    if isinstance(doc, dict):
        err = doc.get("error")
        if isinstance(err, dict) and isinstance(err.get("message"), str):
            return _short(err["message"])
        if isinstance(err, str):
            return _short(err)
        if isinstance(doc.get("message"), str):
            return _short(doc["message"])
    return _short(text)


def chunk_problem(endpoint: str, doc: Any) -> str | None:
    """Why one answer chunk is not shaped like SGLang's (None when it is)."""
    if not isinstance(doc, dict):
        return "a chunk is not a JSON object"
    if endpoint == "/v1/completions":
        choices = doc.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            return "no choices[] in a chunk"
        if not isinstance(choices[0].get("text"), str):
            return "choices[0].text is not a string"
        return None
    if not isinstance(doc.get("meta_info"), dict):
        return "no meta_info in a chunk"
    if not isinstance(doc.get("text"), str) and not isinstance(doc.get("output_ids"), list):
        return "neither text nor output_ids in a chunk"
    return None


def chunk_tokens(endpoint: str, doc: dict[str, Any]) -> int | None:
    if endpoint == "/v1/completions":
        return None
    meta = doc.get("meta_info") or {}
    n = meta.get("completion_tokens")
    if isinstance(n, int):
        return n
    ids = doc.get("output_ids")
    return len(ids) if isinstance(ids, list) else None


class StreamReader:
    """Server-sent events of one answer, fed line by line: ``data: {json}`` chunks, then ``data: [DONE]``."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self.chunks = 0
        self.done = False
        self.tokens: int | None = None
        self.problem: str | None = None  # a malformed answer
        self.error: str | None = None  # an error object inside the stream

    def feed(self, line: str) -> bool:
        """One line of the stream; True when it carried a data chunk (the first one is the first token)."""
        line = line.rstrip("\r\n")
        if not line.startswith("data:") or self.done or self.problem or self.error:
            return False
        data = line[5:].strip()
        if data == "[DONE]":
            self.done = True
            return False
        try:
            doc = json.loads(data)
        except ValueError:
            self.problem = "a chunk is not JSON: " + _short(data)
            return False
        if isinstance(doc, dict) and "error" in doc:
            err = doc["error"]
            msg = err.get("message") if isinstance(err, dict) else err
            self.error = _short(str(msg))
            return False
        problem = chunk_problem(self.endpoint, doc)
        if problem:
            self.problem = problem
            return False
        self.chunks += 1
        if self.endpoint == "/v1/completions":
            self.tokens = (self.tokens or 0) + 1
        else:
            n = chunk_tokens(self.endpoint, doc)
            self.tokens = n if n is not None else self.tokens
        return True

    def outcome(self) -> tuple[str, str | None]:
        """(kind, error) once the stream has ended."""
        if self.error:
            return "error", "error in the answer stream: " + self.error
        if self.problem:
            return "malformed", "malformed answer: " + self.problem
        if not self.chunks:
            return "malformed", "malformed answer: no data chunk before the stream ended"
        if not self.done:
            return "malformed", "malformed answer: the stream ended without data: [DONE]"
        return "ok", None


def json_answer(endpoint: str, body: bytes) -> tuple[str, str | None, int | None]:
    """A server that answered a streaming request with one JSON document: judged by the same shape rules."""
    try:
        doc = json.loads(body.decode("utf-8", "replace"))
    except ValueError:
        return "malformed", "malformed answer: not JSON: " + _short(body.decode("utf-8", "replace")), None
    if isinstance(doc, dict) and "error" in doc:
        return "error", "error in the answer: " + error_text(body), None
    problem = chunk_problem(endpoint, doc)
    if problem:
        return "malformed", "malformed answer: " + problem, None
    return "ok", None, chunk_tokens(endpoint, doc) if isinstance(doc, dict) else None


def send_one(cfg: dict[str, Any], n: int, api_key: str | None) -> dict[str, Any]:
    """Probe request ``n``: POST, read the stream, time the first chunk. Never raises."""
    body = request_body(cfg, n)
    out: dict[str, Any] = {
        "rid": body["rid"],
        "ok": False,
        "kind": "ok",
        "status": None,
        "error": None,
        "ttft_s": None,
        "latency_s": None,
        "tokens": None,
    }
    timeout = float(cfg["timeout_s"])
    t0 = time.monotonic()
    conn = http.client.HTTPConnection(cfg["host"], int(cfg["port"]), timeout=timeout)
    try:
        conn.request("POST", cfg["endpoint"], json.dumps(body).encode(), headers(api_key))
        resp = conn.getresponse()
        out["status"] = resp.status
        if resp.status != 200:
            out["kind"] = "http"
            out["error"] = f"HTTP {resp.status}: {error_text(resp.read(8192))}"
            return out
        ctype = (resp.getheader("Content-Type") or "").lower()
        if "text/event-stream" not in ctype:
            out["kind"], out["error"], out["tokens"] = json_answer(cfg["endpoint"], resp.read(1 << 22))
            out["ttft_s"] = time.monotonic() - t0
        else:
            reader = StreamReader(cfg["endpoint"])
            while True:
                if time.monotonic() - t0 > timeout:
                    raise TimeoutError()
                raw = resp.readline(1 << 22)
                if not raw:
                    break
                if reader.feed(raw.decode("utf-8", "replace")) and out["ttft_s"] is None:
                    out["ttft_s"] = time.monotonic() - t0
                if reader.done or reader.problem or reader.error:
                    break
            out["kind"], out["error"] = reader.outcome()
            out["tokens"] = reader.tokens
    except TimeoutError:
        out["kind"], out["error"] = "timeout", f"no complete answer within {timeout:g}s"
    except (ConnectionError, http.client.HTTPException, OSError) as e:
        out["kind"], out["error"] = "connection", f"{type(e).__name__}: {_short(str(e))}"
    finally:
        out["latency_s"] = time.monotonic() - t0
        conn.close()
    out["ok"] = out["kind"] == "ok"
    return out


def wave(cfg: dict[str, Any], api_key: str | None) -> list[dict[str, Any]]:
    """``requests`` probe requests, ``concurrency`` at a time, numbered from ``first``; in request order."""
    first = int(cfg.get("first", 0))
    numbers = range(first, first + int(cfg["requests"]))
    workers = max(1, min(int(cfg["concurrency"]), int(cfg["requests"])))
    with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(lambda n: send_one(cfg, n, api_key), numbers))


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
        return None, f"{type(e).__name__}: {_short(str(e))}"
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


REQUIRED = {"ready": ("host", "port", "ready_path", "wait_s"), "wave": ("host", "port", "endpoint", "rid_prefix")}


def run(cfg: dict[str, Any]) -> dict[str, Any]:
    """One invocation: the config -> the JSON document to print."""
    mode = cfg.get("mode")
    if mode not in REQUIRED:
        raise ValueError(f"mode must be one of {', '.join(sorted(REQUIRED))}, not {mode!r}")
    missing = [k for k in REQUIRED[mode] if k not in cfg]
    if missing:
        raise ValueError("missing config key(s): " + ", ".join(missing))
    api_key, auth_error = read_env_value(cfg.get("env_file"), cfg.get("api_key_env") or "SGLANG_API_KEY")
    t0 = time.monotonic()
    if mode == "ready":
        out = wait_ready(cfg, api_key)
    else:
        if not cfg.get("input_ids") and not cfg.get("prompts"):
            raise ValueError("a wave needs prompts or input_ids")
        out = {"requests": wave(cfg, api_key)}
    out.update(auth=api_key is not None, auth_error=auth_error, elapsed_s=time.monotonic() - t0)
    return out


def main(argv: list[str]) -> int:
    try:
        cfg = json.loads(argv[1]) if len(argv) > 1 else None
        if not isinstance(cfg, dict):
            raise ValueError("argv[1] must be the configuration as a JSON object")
        out = run(cfg)
    except (ValueError, KeyError, TypeError) as e:
        print(json.dumps({"config_error": str(e)}))
        return 2
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
