"""The pure parts of the stand-in server (:mod:`kdtree_backend.serve`): request parsing, the toy tokenizer,
the JSON shapes of SGLang 0.5.23's answers, and the injected faults' effect on parity lines.

No I/O here: the server parses a body into :class:`GenerateRequest` objects, decodes them by tree speculative
decoding through the real verify path (:mod:`kdtree_backend.specdecode`), and builds its answers with the ``*_response`` / ``*_chunk`` functions.
"""

from __future__ import annotations

import json
import math
import time
import uuid
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .config import StandinFault
from .wire import MARKER

SGLANG_VERSION = "0.5.23"
VOCAB = 32000
DEFAULT_MAX_NEW_TOKENS = 128  # SGLang's default for /generate
DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
MAX_NEW_TOKENS_LIMIT = 4096


class BadRequest(ValueError):
    """A malformed request body: answered with 400 and this message (SGLang's error shape)."""


@dataclass(frozen=True)
class GenerateRequest:
    """One prompt's generation: its id, prompt token ids, and how many tokens to decode."""

    rid: str
    prompt_ids: tuple[int, ...]
    max_new_tokens: int


# ---------------------------------------------------------------------------------------------- tokens


def tokenize(text: str) -> tuple[int, ...]:
    """A stand-in tokenizer: one id per whitespace-separated word (a CRC of the word), at least one id."""
    words = text.split() or [""]
    return tuple(zlib.crc32(word.encode()) % (VOCAB - 1) + 1 for word in words)


def detokenize(ids: Sequence[int]) -> str:
    return "".join(f" tok{token}" for token in ids)


# ---------------------------------------------------------------------------------------------- parsing


def _json_object(body: bytes) -> Mapping[str, Any]:
    try:
        data = json.loads(body.decode("utf-8") or "null")
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BadRequest(f"the request body is not valid JSON: {exc}") from None
    if not isinstance(data, Mapping):
        raise BadRequest("the request body must be a JSON object")
    return data


def _count(value: object, name: str, default: int) -> int:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_NEW_TOKENS_LIMIT:
        raise BadRequest(f"{name} must be an integer in 0..{MAX_NEW_TOKENS_LIMIT}, got {value!r}")
    return value


def _id_list(value: object, name: str) -> tuple[int, ...]:
    if not isinstance(value, list) or not value:
        raise BadRequest(f"{name} must be a non-empty list of token ids")
    if not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < 1 << 31 for t in value):
        raise BadRequest(f"{name} must hold non-negative integer token ids")
    return tuple(value)


def _prompts(text: object, input_ids: object, *, skip_tokenizer_init: bool, field: str) -> tuple[list, bool]:
    """(prompt id tuples, batched?) from SGLang's ``text`` / ``input_ids`` (one of them, single or a list)."""
    if (text is None) == (input_ids is None):
        raise BadRequest(f"give exactly one of {field} and input_ids")
    if text is not None:
        if skip_tokenizer_init:
            raise BadRequest("this server runs with --skip-tokenizer-init: send input_ids, not text")
        if isinstance(text, str):
            return [tokenize(text)], False
        if isinstance(text, list) and text and all(isinstance(t, str) for t in text):
            return [tokenize(t) for t in text], True
        raise BadRequest(f"{field} must be a string or a non-empty list of strings")
    if isinstance(input_ids, list) and input_ids and all(isinstance(row, list) for row in input_ids):
        return [_id_list(row, "input_ids[i]") for row in input_ids], True
    return [_id_list(input_ids, "input_ids")], False


def _rids(raw: object, count: int, batched: bool) -> list[str]:
    if raw is None:
        return [uuid.uuid4().hex for _ in range(count)]
    if not batched and isinstance(raw, str) and raw:
        return [raw]
    if batched and isinstance(raw, list) and len(raw) == count and all(isinstance(r, str) and r for r in raw):
        return list(raw)
    want = "a list of non-empty strings, one per prompt" if batched else "a non-empty string"
    raise BadRequest(f"rid must be {want}, got {raw!r}")


@dataclass(frozen=True)
class GenerateCall:
    requests: tuple[GenerateRequest, ...]
    batched: bool
    stream: bool


def parse_generate(body: bytes, *, skip_tokenizer_init: bool = False) -> GenerateCall:
    """SGLang's ``POST /generate`` body."""
    data = _json_object(body)
    params = data.get("sampling_params") or {}
    if not isinstance(params, Mapping):
        raise BadRequest("sampling_params must be an object")
    temperature = params.get("temperature", 1.0)
    if isinstance(temperature, bool) or not isinstance(temperature, int | float) or temperature < 0:
        raise BadRequest(f"sampling_params.temperature must be a number >= 0, got {temperature!r}")
    max_new = _count(params.get("max_new_tokens"), "sampling_params.max_new_tokens", DEFAULT_MAX_NEW_TOKENS)
    prompts, batched = _prompts(
        data.get("text"), data.get("input_ids"), skip_tokenizer_init=skip_tokenizer_init, field="text"
    )
    stream = data.get("stream", False)
    if not isinstance(stream, bool):
        raise BadRequest(f"stream must be true or false, got {stream!r}")
    if stream and batched:
        raise BadRequest("stream with a batch of prompts is not supported by this server: send one prompt")
    rids = _rids(data.get("rid"), len(prompts), batched)
    requests = tuple(GenerateRequest(rid, ids, max_new) for rid, ids in zip(rids, prompts, strict=True))
    return GenerateCall(requests, batched, stream)


def parse_completions(body: bytes, *, skip_tokenizer_init: bool = False) -> tuple[GenerateCall, str]:
    """OpenAI's ``POST /v1/completions`` body: (the call, the model name to echo)."""
    data = _json_object(body)
    prompt = data.get("prompt")
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
        prompts, batched = _prompts(None, prompt, skip_tokenizer_init=skip_tokenizer_init, field="prompt")
    elif prompt is None:
        raise BadRequest("prompt is required")
    else:
        prompts, batched = _prompts(prompt, None, skip_tokenizer_init=skip_tokenizer_init, field="prompt")
    temperature = data.get("temperature", 1.0)
    if isinstance(temperature, bool) or not isinstance(temperature, int | float) or temperature < 0:
        raise BadRequest(f"temperature must be a number >= 0, got {temperature!r}")
    max_tokens = _count(data.get("max_tokens"), "max_tokens", DEFAULT_MAX_TOKENS)
    stream = data.get("stream", False)
    if not isinstance(stream, bool):
        raise BadRequest(f"stream must be true or false, got {stream!r}")
    if stream and batched:
        raise BadRequest("stream with a batch of prompts is not supported by this server: send one prompt")
    model = data.get("model", "default")
    if not isinstance(model, str):
        raise BadRequest(f"model must be a string, got {model!r}")
    rid = f"cmpl-{uuid.uuid4().hex}"
    requests = tuple(GenerateRequest(f"{rid}-{i}", ids, max_tokens) for i, ids in enumerate(prompts))
    return GenerateCall(requests, batched, stream), model


# ---------------------------------------------------------------------------------------------- answers


def error_body(message: str, status: int) -> dict[str, Any]:
    kind = {400: "BadRequestError", 401: "AuthenticationError", 503: "ServiceUnavailableError"}
    return {"error": {"message": message, "type": kind.get(status, "InternalServerError"), "code": status}}


@dataclass(frozen=True)
class Generated:
    request: GenerateRequest
    output_ids: tuple[int, ...]
    steps: int
    started: float  # time.monotonic() when the request arrived
    finished: bool = True


def generate_item(result: Generated, *, with_text: bool, now: float | None = None) -> dict[str, Any]:
    """One prompt's answer (or stream chunk) of ``/generate``: cumulative text and ids so far."""
    n = len(result.output_ids)
    finish = {"type": "length", "length": n} if result.finished else None
    return {
        "text": detokenize(result.output_ids) if with_text else "",
        "output_ids": list(result.output_ids),
        "meta_info": {
            "id": result.request.rid,
            "finish_reason": finish,
            "prompt_tokens": len(result.request.prompt_ids),
            "completion_tokens": n,
            "cached_tokens": 0,
            "spec_verify_ct": result.steps,
            "e2e_latency": round((time.monotonic() if now is None else now) - result.started, 6),
            **spec_accept_length(n, result.steps),
        },
    }


def spec_accept_length(completion_tokens: int, verify_ct: int) -> dict[str, float]:
    """SGLang's ``spec_accept_length``: tokens per verify step, the bonus token included (completion_tokens /
    spec_verify_ct); absent before the first verify step, as SGLang leaves it out then."""
    return {"spec_accept_length": completion_tokens / verify_ct} if verify_ct > 0 else {}


def completion_response(results: Sequence[Generated], model: str, created: int) -> dict[str, Any]:
    prompt = sum(len(r.request.prompt_ids) for r in results)
    completion = sum(len(r.output_ids) for r in results)
    return {
        "id": results[0].request.rid.rsplit("-", 1)[0] if results else f"cmpl-{uuid.uuid4().hex}",
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [
            {"index": i, "text": detokenize(r.output_ids), "logprobs": None, "finish_reason": "length"}
            for i, r in enumerate(results)
        ],
        "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion},
    }


def completion_chunk(rid: str, model: str, created: int, text: str, finish: str | None) -> dict[str, Any]:
    return {
        "id": rid,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}],
    }


def sse(data: Mapping[str, Any] | str) -> bytes:
    """One server-sent event: ``data: {json}`` (or ``data: [DONE]``) and a blank line."""
    payload = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    return f"data: {payload}\n\n".encode()


# ---------------------------------------------------------------------------------------------- faults


LINE_MAX = 48 * 1024  # journald's default LineMax: a longer stdout line is cut into entries of this many bytes
SPLIT_AT_TOKEN = 16  # split-line: how many of the token's characters the first piece keeps


def fault_line(fault: StandinFault | None, line: str, seen: set[int]) -> str:
    """The line the stand-in prints for ``line`` under ``fault``. split-line:R: rank R's first parity line fails
    (rel=5.0e-01) and is padded so that journald's LineMax cut falls :data:`SPLIT_AT_TOKEN` characters into its
    token (the first piece ends ``token=<16 characters>``, the next begins with the rest), once per process."""
    if fault is None or fault.kind != "split-line" or not line.startswith(MARKER + " L"):
        return line
    rank = int(fault.value)
    head, sep, token = line.partition(f" tp={rank} token=")
    if not sep or rank in seen:
        return line
    seen.add(rank)
    layer = head.split(" ", 2)[1]
    failing = f"{MARKER} {layer} max_abs_diff=5.0000e-01 mean=1.0000e-01 rel=5.0000e-01 pad="
    tail = f" tp={rank} token="
    pad = LINE_MAX - len(failing) - len(tail) - SPLIT_AT_TOKEN
    return failing + "y" * pad + tail + token


def fault_parity(
    fault: StandinFault | None, rank: int, stats: tuple[float, float, float]
) -> tuple[float, float, float] | None:
    """The parity stats rank ``rank`` prints under ``fault`` (None: it prints no line)."""
    if fault is None:
        return stats
    max_abs, mean, rel = stats
    if fault.kind == "nan":
        return max_abs, mean, math.nan
    if fault.kind == "rel-offset":
        return max_abs, mean, rel + fault.value
    if fault.kind == "silent-rank" and rank == int(fault.value):
        return None
    return stats
