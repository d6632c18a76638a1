"""One probe request on the host: its body and headers, the HTTP/SSE stream client (``send_one``) and the reader
of SGLang's answer chunks (``StreamReader``, ``json_answer``).

Part of the probe's host program (opsctl/probe/traffic_on_host.py): standard library only, Python 3.10.
"""

from __future__ import annotations

import http.client
import json
import time
from typing import Any

from .budget import cut_by_deadline

ERROR_TEXT_MAX = 200


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


def shortened(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= ERROR_TEXT_MAX else text[: ERROR_TEXT_MAX - 3] + "..."


def error_text(body: bytes) -> str:
    """What an error answer says: SGLang's ``{"error": {"message": ...}}`` / ``{"message": ...}``, else the text."""
    text = body.decode("utf-8", "replace")
    try:
        doc = json.loads(text)
    except ValueError:
        return shortened(text)
    if isinstance(doc, dict):
        err = doc.get("error")
        if isinstance(err, dict) and isinstance(err.get("message"), str):
            return shortened(err["message"])
        if isinstance(err, str):
            return shortened(err)
        if isinstance(doc.get("message"), str):
            return shortened(doc["message"])
    return shortened(text)


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
            self.problem = "a chunk is not JSON: " + shortened(data)
            return False
        if isinstance(doc, dict) and "error" in doc:
            err = doc["error"]
            msg = err.get("message") if isinstance(err, dict) else err
            self.error = shortened(str(msg))
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

    def token_count(self) -> int:
        """The tokens of the answer so far: its ids (``/generate``), else the chunks counted."""
        return len(self.output_ids) if self.endpoint == "/generate" else self.tokens or 0

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
        return "malformed", "malformed answer: not JSON: " + shortened(body.decode("utf-8", "replace")), None
    if isinstance(doc, dict) and "error" in doc:
        return "error", "error in the answer: " + error_text(body), None
    problem = chunk_problem(endpoint, doc)
    if problem:
        return "malformed", "malformed answer: " + problem, None
    return "ok", None, chunk_tokens(endpoint, doc) if isinstance(doc, dict) else None


def new_record(rid: str) -> dict[str, Any]:
    """What ``send_one`` returns before anything happened: the probe's fields, and for the comparison the output
    ids, the last ``meta_info`` and the times of the first and last token-carrying chunks."""
    return {
        "rid": rid,
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


def note_chunk(out: dict[str, Any], now: float, before: int, count: int) -> None:
    """A data chunk came ``now`` seconds in, with ``count`` tokens so far (``before`` before it)."""
    if out["ttft_s"] is None:
        out["ttft_s"] = now
    if count > 0 and out["first_token_s"] is None:
        out["first_token_s"], out["first_tokens"] = now, count
    if count > before:
        out["last_s"] = now


def read_stream(resp: http.client.HTTPResponse, endpoint: str, out: dict[str, Any], t0: float, timeout: float) -> None:
    """Read an event stream into ``out`` until ``data: [DONE]``, a malformed chunk, an error object or its end;
    TimeoutError past ``timeout`` seconds since ``t0``."""
    reader = StreamReader(endpoint)
    while True:
        if time.monotonic() - t0 > timeout:
            raise TimeoutError()
        raw = resp.readline(1 << 22)
        if not raw:
            break
        before = reader.token_count()
        if reader.feed(raw.decode("utf-8", "replace")):
            note_chunk(out, time.monotonic() - t0, before, reader.token_count())
        if reader.done or reader.problem or reader.error:
            break
    out["kind"], out["error"] = reader.outcome()
    out["tokens"] = reader.tokens
    out["output_ids"], out["meta"] = reader.output_ids, reader.meta


def read_answer(resp: http.client.HTTPResponse, endpoint: str, out: dict[str, Any], t0: float, timeout: float) -> None:
    """An answer into ``out``: a status other than 200 (``http``), one JSON document, or an event stream."""
    out["status"] = resp.status
    if resp.status != 200:
        out["kind"] = "http"
        out["error"] = f"HTTP {resp.status}: {error_text(resp.read(8192))}"
        return
    ctype = (resp.getheader("Content-Type") or "").lower()
    if "text/event-stream" in ctype:
        read_stream(resp, endpoint, out, t0, timeout)
        return
    out["kind"], out["error"], out["tokens"] = json_answer(endpoint, resp.read(1 << 22))
    out["ttft_s"] = time.monotonic() - t0


def timed_out(allowed_s: float, timeout_s: float) -> tuple[str, str]:
    """(kind, error) of a request that ran out of its ``allowed_s``: ``cut`` by the gate's deadline, or ``timeout``."""
    if cut_by_deadline("timeout", allowed_s, timeout_s):
        return "cut", f"cut short by the gate's deadline after {round(allowed_s, 1):g}s (timeout_s {timeout_s:g})"
    return "timeout", f"no complete answer within {round(allowed_s, 1):g}s"


def send_one(
    cfg: dict[str, Any], n: int, api_key: str | None, finish_by: float | None = None, index: int | None = None
) -> dict[str, Any]:
    """Request ``n``: POST, read the stream, time the first and the last token. Never raises. Gives up at
    ``timeout_s`` or at ``finish_by`` (a ``time.monotonic()`` instant: the gate's deadline), whichever is first;
    one given up at ``finish_by`` before ``timeout_s`` is of kind ``cut`` (``cut_by_deadline``), not a timeout.

    Beyond the probe's fields the record keeps, for the comparison: the output ids and the last ``meta_info``
    (``/generate``), and when the first and the last token-carrying chunk came with how many tokens so far."""
    body = request_body(cfg, n, index)
    out = new_record(body["rid"])
    t0 = time.monotonic()
    timeout_s = float(cfg["timeout_s"])
    # in_budget starts a request only with request_time_s's minimum left; 1 ms keeps the socket's timeout positive.
    timeout = timeout_s if finish_by is None else max(0.001, min(timeout_s, finish_by - t0))
    conn = http.client.HTTPConnection(cfg["host"], int(cfg["port"]), timeout=timeout)
    try:
        conn.request("POST", cfg["endpoint"], json.dumps(body).encode(), headers(api_key))
        read_answer(conn.getresponse(), cfg["endpoint"], out, t0, timeout)
    except TimeoutError:
        out["kind"], out["error"] = timed_out(timeout, timeout_s)
    except (ConnectionError, http.client.HTTPException, OSError) as e:
        out["kind"], out["error"] = "connection", f"{type(e).__name__}: {shortened(str(e))}"
    finally:
        out["latency_s"] = time.monotonic() - t0
        conn.close()
    out["ok"] = out["kind"] == "ok"
    return out
