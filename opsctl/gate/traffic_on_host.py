"""The gate's verify traffic, run on the host: readiness polls, probe waves and the comparison workload against the
service's own HTTP API on the host's loopback (docs/gate.md "The probe", "The comparison workload").

opsctl ships this file's text to the host as ``python3 -``, on stdin, with the configuration (JSON) written into
the ``CONFIG_TEXT`` line (opsctl/gate/traffic.py: ``payload``): nothing of it is in argv, where ``ps`` shows it
and the kernel caps one argument at 128 KiB. The operator's machine never reaches the service port, and the host
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
  request in the form of opsctl/gate/sample.py.

Budgets (``wave`` and ``compare``): no request starts after ``start_within_s`` (so the gate reads the journal
between requests) or with less than ``min(timeout_s, MIN_REQUEST_S)`` left, and none runs past
``finish_within_s`` (the gate's deadline); the requests not sent are counted in ``unsent``.

Kept to the standard library and to the Python of older hosts (3.10: the first whose socket timeouts are
TimeoutError): no third-party import, no match statement.
"""

from __future__ import annotations

import http.client
import json
import sys
import threading
import time
from typing import Any

ERROR_TEXT_MAX = 200


def parse_environment_file(text: str) -> dict[str, str]:
    """A systemd EnvironmentFile's assignments, read as systemd reads them (its env-file parser): a line ends at
    ``\n`` or ``\r`` only (never at U+0085, U+2028, form feeds: ``str.splitlines`` would split there and let
    ``OTHER=x\x85KEY=injected`` set KEY); ``#`` or ``;`` first on a line makes a comment (a backslash at its end
    continues it); whitespace around the key and after ``=`` is dropped, as is trailing whitespace of an unquoted
    value; ``'...'`` is taken literally; in ``"..."`` a backslash escapes ``"``, ``\\``, `` ` `` and ``$`` and
    is kept before anything else, and a backslash-newline is dropped; an unquoted backslash escapes the next
    character (a backslash-newline continues the line); quoted and unquoted parts next to each other join. A key
    that is not a variable name is ignored; the last assignment wins."""
    out: dict[str, str] = {}
    newline, blank = "\n\r", " \t\n\r"
    state = "pre_key"
    key: list[str] = []
    value: list[str] = []
    key_ws: int | None = None  # where the key's trailing whitespace starts
    value_ws: int | None = None  # where the unquoted value's trailing whitespace starts

    def push() -> None:
        name = "".join(key[:key_ws] if key_ws is not None else key)
        text_value = "".join(value[:value_ws] if value_ws is not None else value)
        if name and (name[0].isalpha() or name[0] == "_") and all(c.isalnum() or c == "_" for c in name):
            if name.isascii():
                out[name] = text_value

    for c in text:
        if state == "pre_key":
            if c in "#;":
                state = "comment"
            elif c not in blank:
                state, key, value, key_ws, value_ws = "key", [c], [], None, None
        elif state == "key":
            if c in newline:
                state = "pre_key"  # a line without '=': ignored
            elif c == "=":
                state, value_ws = "pre_value", None
            else:
                if c not in blank:
                    key_ws = None
                elif key_ws is None:
                    key_ws = len(key)
                key.append(c)
        elif state == "pre_value":
            if c in newline:
                push()
                state = "pre_key"
            elif c == "'":
                state = "single"
            elif c == '"':
                state = "double"
            elif c == "\\":
                state = "value_escape"
            elif c not in blank:
                state = "value"
                value.append(c)
        elif state == "value":
            if c in newline:
                push()
                state = "pre_key"
            elif c == "\\":
                state, value_ws = "value_escape", None
            else:
                if c not in blank:
                    value_ws = None
                elif value_ws is None:
                    value_ws = len(value)
                value.append(c)
        elif state == "value_escape":
            state = "value"
            if c not in newline:
                value.append(c)
        elif state == "single":
            if c == "'":
                state = "pre_value"
            else:
                value.append(c)
        elif state == "double":
            if c == '"':
                state = "pre_value"
            elif c == "\\":
                state = "double_escape"
            else:
                value.append(c)
        elif state == "double_escape":
            state = "double"
            if c in '"\\`$':
                value.append(c)
            elif c != "\n":
                value.extend(("\\", c))
        elif state == "comment":
            if c == "\\":
                state = "comment_escape"
            elif c in newline:
                state = "pre_key"
        else:  # comment_escape
            state = "comment"
    if state in ("pre_value", "value", "value_escape", "single", "double", "double_escape"):
        push()
    return out


def header_problem(value: str) -> bool:
    """Whether ``value`` cannot be sent as an HTTP header value: a character outside Latin-1 (http.client encodes
    headers as Latin-1) or a control character (C0, DEL, C1: a CR or LF would end the header)."""
    return any(ord(c) > 0xFF or ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F for c in value)


def read_env_value(path: str | None, name: str) -> tuple[str | None, str | None]:
    """The API key: ``name``'s value in the systemd EnvironmentFile ``path`` -> (value or None, why no key is sent
    or None). A file that does not exist is no key (systemd's ``EnvironmentFile=-`` ignores it too); an
    unreadable one, or one that is not UTF-8 (systemd refuses it), is reported without its content. A value that
    cannot go in an HTTP header is refused; the message never shows the value or any character of it."""
    if not path:
        return None, None
    try:
        with open(path, "rb") as fh:
            raw = fh.read(1 << 20)
    except FileNotFoundError:
        return None, None
    except OSError as e:
        return None, f"cannot read {path}: {e.strerror or type(e).__name__}"
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return None, f"{path} is not UTF-8 text (systemd refuses it too)"
    value = parse_environment_file(text).get(name)
    if value and header_problem(value):
        return None, (
            f"${name} in {path} cannot be sent in an HTTP header (it holds a character outside Latin-1 or a "
            "control character); the key is not shown"
        )
    return (value or None), None


def request_body(cfg: dict[str, Any], n: int, index: int | None = None) -> dict[str, Any]:
    """The JSON body of request ``n``: greedy (temperature 0), streaming, request id ``<rid_prefix>-<n>``, prompt
    (or token ids) number ``index`` (default: the n-th in turn)."""
    rid = f"{cfg['rid_prefix']}-{n}"
    ids = cfg.get("input_ids")
    i = n if index is None else index
    prompt: Any = ids[i % len(ids)] if ids else cfg["prompts"][i % len(cfg["prompts"])]
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


def merged_ids(so_far: list[int], chunk: Any) -> list[int]:
    """The answer's token ids after one more ``/generate`` chunk. SGLang streams them cumulatively by default and
    as disjoint pieces with ``--stream-output``: a chunk that extends what came so far replaces it, any other is
    appended. Anything that is not a list of integers is ignored."""
    if not isinstance(chunk, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in chunk):
        return so_far
    if len(chunk) >= len(so_far) and chunk[: len(so_far)] == so_far:
        return list(chunk)
    return so_far + chunk


class StreamReader:
    """Server-sent events of one answer, fed line by line: ``data: {json}`` chunks, then ``data: [DONE]``."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self.chunks = 0
        self.done = False
        self.tokens: int | None = None
        self.problem: str | None = None  # a malformed answer
        self.error: str | None = None  # an error object inside the stream
        self.output_ids: list[int] = []  # /generate: the answer's token ids so far
        self.meta: dict[str, Any] = {}  # /generate: the last chunk's meta_info

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
            self.meta = doc["meta_info"]
            self.output_ids = merged_ids(self.output_ids, doc.get("output_ids"))
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


def send_one(
    cfg: dict[str, Any], n: int, api_key: str | None, finish_by: float | None = None, index: int | None = None
) -> dict[str, Any]:
    """Request ``n``: POST, read the stream, time the first and the last token. Never raises. Gives up at
    ``timeout_s`` or at ``finish_by`` (a ``time.monotonic()`` instant: the gate's deadline), whichever is first;
    one given up at ``finish_by`` before ``timeout_s`` is of kind ``cut`` (``cut_by_deadline``), not a timeout.

    Beyond the probe's fields the record keeps, for the comparison: the output ids and the last ``meta_info``
    (``/generate``), and when the first and the last token-carrying chunk came with how many tokens so far."""
    body = request_body(cfg, n, index)
    out: dict[str, Any] = {
        "rid": body["rid"],
        "ok": False,
        "kind": "ok",
        "status": None,
        "error": None,
        "ttft_s": None,
        "latency_s": None,
        "tokens": None,
        "output_ids": [],
        "meta": {},
        "first_token_s": None,  # when the first chunk carrying tokens came (TTFT for the comparison)
        "first_tokens": None,  # how many tokens that chunk carried
        "last_s": None,  # when the last chunk carrying new tokens came
    }
    t0 = time.monotonic()
    timeout_s = float(cfg["timeout_s"])
    # in_budget starts a request only with request_time_s's minimum left; 1 ms keeps the socket's timeout positive.
    timeout = timeout_s if finish_by is None else max(0.001, min(timeout_s, finish_by - t0))
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
                before = len(reader.output_ids) if cfg["endpoint"] == "/generate" else reader.tokens or 0
                if reader.feed(raw.decode("utf-8", "replace")):
                    now = time.monotonic() - t0
                    count = len(reader.output_ids) if cfg["endpoint"] == "/generate" else reader.tokens or 0
                    if out["ttft_s"] is None:
                        out["ttft_s"] = now
                    if count > 0 and out["first_token_s"] is None:
                        out["first_token_s"], out["first_tokens"] = now, count
                    if count > before:
                        out["last_s"] = now
                if reader.done or reader.problem or reader.error:
                    break
            out["kind"], out["error"] = reader.outcome()
            out["tokens"] = reader.tokens
            out["output_ids"], out["meta"] = reader.output_ids, reader.meta
    except TimeoutError:
        if cut_by_deadline("timeout", timeout, timeout_s):
            out["kind"] = "cut"
            out["error"] = f"cut short by the gate's deadline after {round(timeout, 1):g}s (timeout_s {timeout_s:g})"
        else:
            out["kind"], out["error"] = "timeout", f"no complete answer within {round(timeout, 1):g}s"
    except (ConnectionError, http.client.HTTPException, OSError) as e:
        out["kind"], out["error"] = "connection", f"{type(e).__name__}: {_short(str(e))}"
    finally:
        out["latency_s"] = time.monotonic() - t0
        conn.close()
    out["ok"] = out["kind"] == "ok"
    return out


PROBE_KEYS = ("rid", "ok", "kind", "status", "error", "ttft_s", "latency_s", "tokens")


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


def wave(cfg: dict[str, Any], api_key: str | None, t0: float | None = None) -> tuple[list[dict[str, Any]], int]:
    """``requests`` probe requests, ``concurrency`` at a time, numbered from ``first``, within the budget ->
    (the requests sent, in order; how many were not sent)."""
    first = int(cfg.get("first", 0))
    numbers = list(range(first, first + int(cfg["requests"])))
    sent, unsent = in_budget(
        cfg, numbers, lambda n, finish_by: send_one(cfg, n, api_key, finish_by), t0 or time.monotonic()
    )
    return [{k: r[k] for k in PROBE_KEYS} for r in sent], unsent


# ------------------------------------------------------------------------------------------------ comparison

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
    """Seconds a fixed piece of CPU work takes now (the comparison's host figure, opsctl/gate/compare.py): run
    between requests, while the server is idle, it grows only when something else on the host takes the CPU."""
    started = clock()
    for _ in range(CALIBRATION_LOOPS):
        sum(i * i for i in range(20_000))
    return clock() - started


def _finite(value: Any, integer: bool = False) -> Any:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if integer:
        return value if isinstance(value, int) and value >= 0 else None
    return float(value) if value == value and abs(value) != float("inf") and value >= 0 else None


def compare_record(rec: dict[str, Any], load: float | None) -> dict[str, Any]:
    """One measured request in the sample's form (opsctl/gate/sample.py), from the times this program saw the
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


# ------------------------------------------------------------------------------------------------ entry

REQUIRED = {
    "ready": ("host", "port", "ready_path", "wait_s"),
    "wave": ("host", "port", "endpoint", "rid_prefix", "requests", "max_new_tokens", "timeout_s"),
    "compare": ("host", "port", "endpoint", "rid_prefix", "max_new_tokens", "timeout_s"),
}
NUMBERS = ("port", "wait_s", "requests", "concurrency", "max_new_tokens", "timeout_s", "first", "warmup")
BUDGETS = ("start_within_s", "finish_within_s")


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
    if mode == "compare" and isinstance(cfg.get("concurrency"), list):
        if not cfg["concurrency"] or any(
            isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in cfg["concurrency"]
        ):
            raise ValueError("concurrency must be a number or a list of positive integers")
        cfg = dict(cfg, levels=cfg["concurrency"], concurrency=None)
    for key in NUMBERS + BUDGETS:
        value = cfg.get(key)
        if key in cfg and value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
            raise ValueError(f"{key} must be a number")
        if key in cfg and value is not None and value < 0:
            raise ValueError(f"{key} must not be negative")
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
# stdin (opsctl/gate/traffic.py: payload): the configuration never goes in argv, where `ps` shows it and the
# kernel caps one argument at 128 KiB.
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
    # By hand: `python3 traffic_on_host.py < config.json`.
    sys.exit(main(CONFIG_TEXT if CONFIG_TEXT is not None else sys.stdin.read()))
