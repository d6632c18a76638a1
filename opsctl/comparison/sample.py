"""One side of a comparison: what the comparison workload saw on one release (docs/gate.md "The comparison
workload"), as data the judge reads and the history records.

A sample is untrusted once it has left the process (a history file, a file given to ``opsctl compare``, the host
program's answer), so ``from_json`` checks every field strictly: exact types (``true`` is not an integer, ``"1"``
is not a token id), finite non-negative numbers, bounded sizes; it raises ``SampleError`` naming the field
(``requests[3].output_ids[2]: must be an integer``). ``to_json`` writes what ``from_json`` reads back unchanged.

JSON form::

    {"requests": [{"output_ids": [int, ...], "decode_s_per_token": float|null, "ttft_s": float|null,
                   "spec_accept_length": float|null, "spec_verify_ct": int|null, "completion_tokens": int,
                   "load": float|null, "host_s": float|null, "status": int|null, "error": str|null,
                   "decode_s": float|null, "concurrency": int|null}],
     "load_source": "metrics"|null}

Only ``output_ids``, ``decode_s_per_token``, ``ttft_s`` and ``spec_accept_length`` are required in a request;
the others default to: ``completion_tokens`` = len(output_ids), the rest null. ``decode_s`` (the decode time,
first to last token) and ``concurrency`` (the level the request was sent at) came with issue 48: a sample written
before has neither, and is read and judged as one level (null) timed per token.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from ..probe.answers import is_client_error

# Bounds on what a sample may hold (a recorded sample is untrusted input to the judge).
MAX_REQUESTS = 4096
MAX_OUTPUT_IDS = 65_536
MAX_TOKEN_ID = 2**31 - 1
MAX_ERROR_CHARS = 1000
MAX_SECONDS = 1e6  # a time above ~11 days is not a measurement
MAX_CONCURRENCY = 4096

LOAD_SOURCES = ("metrics",)

_REQUEST_KEYS = frozenset(
    {
        "output_ids",
        "decode_s_per_token",
        "ttft_s",
        "spec_accept_length",
        "spec_verify_ct",
        "completion_tokens",
        "load",
        "host_s",
        "status",
        "error",
        "decode_s",
        "concurrency",
    }
)
_REQUIRED_REQUEST_KEYS = ("output_ids", "decode_s_per_token", "ttft_s", "spec_accept_length")
_SAMPLE_KEYS = frozenset({"requests", "load_source"})


class SampleError(ValueError):
    """A sample that is not one: the message names the field (``requests[3].ttft_s: ...``)."""


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _seconds(where: str, value: Any) -> float | None:
    if value is None:
        return None
    if not _is_number(value) or not math.isfinite(value) or value < 0 or value > MAX_SECONDS:
        raise SampleError(f"{where}: must be a finite number of seconds in [0, {MAX_SECONDS:g}] or null")
    return float(value)


def _nonneg_float(where: str, value: Any, limit: float) -> float | None:
    if value is None:
        return None
    if not _is_number(value) or not math.isfinite(value) or value < 0 or value > limit:
        raise SampleError(f"{where}: must be a finite number in [0, {limit:g}] or null")
    return float(value)


def _nonneg_int(where: str, value: Any, limit: int) -> int | None:
    if value is None:
        return None
    if not _is_int(value) or value < 0 or value > limit:
        raise SampleError(f"{where}: must be an integer in [0, {limit}] or null")
    return int(value)


def _concurrency(where: str, value: Any) -> int | None:
    if value is None:
        return None
    if not _is_int(value) or not 1 <= value <= MAX_CONCURRENCY:
        raise SampleError(f"{where}: must be an integer in [1, {MAX_CONCURRENCY}] or null")
    return int(value)


def _check_keys(where: str, doc: Mapping[Any, Any], allowed: frozenset[str], required: tuple[str, ...] = ()) -> None:
    unknown = sorted(str(k) for k in doc if k not in allowed)
    if unknown:
        raise SampleError(f"{where}: unknown key(s) {', '.join(repr(k[:40]) for k in unknown[:5])}")
    missing = [k for k in required if k not in doc]
    if missing:
        raise SampleError(f"{where}: missing key(s) {', '.join(missing)}")


def _output_ids(where: str, ids: Any) -> tuple[int, ...]:
    if not isinstance(ids, list):
        raise SampleError(f"{where}: must be a list of token ids")
    if len(ids) > MAX_OUTPUT_IDS:
        raise SampleError(f"{where}: more than {MAX_OUTPUT_IDS} token ids")
    for i, t in enumerate(ids):
        if not _is_int(t) or t < 0 or t > MAX_TOKEN_ID:
            raise SampleError(f"{where}[{i}]: must be an integer in [0, {MAX_TOKEN_ID}]")
    return tuple(ids)


def _http_status(where: str, value: Any) -> int | None:
    if value is not None and (not _is_int(value) or not 100 <= value <= 599):
        raise SampleError(f"{where}: must be an HTTP status (100-599) or null")
    return value


def _error(where: str, value: Any) -> str | None:
    if value is not None and not isinstance(value, str):
        raise SampleError(f"{where}: must be a string or null")
    return value[:MAX_ERROR_CHARS] if value is not None else None


@dataclass(frozen=True)
class CompareRequest:
    """One request of the comparison workload, as the host saw it.

    ``decode_s_per_token``: seconds per token after the first one, timed on the host from the stream (null when
    the request failed or produced fewer than two tokens). ``ttft_s``: seconds to the first token.
    ``spec_accept_length`` / ``spec_verify_ct``: from the server's ``meta_info`` when it reports them.
    ``load``: the server's running requests (``sglang:num_running_reqs``) around the request, null when it exposes
    none. ``status``: the HTTP status (null when none came back); ``error``: why the request failed, else null."""

    output_ids: tuple[int, ...]
    decode_s_per_token: float | None
    ttft_s: float | None
    spec_accept_length: float | None = None
    spec_verify_ct: int | None = None
    completion_tokens: int = 0
    load: float | None = None
    host_s: float | None = None  # seconds a fixed CPU loop took on the host around it (host contention)
    status: int | None = None
    error: str | None = None
    decode_s: float | None = None  # seconds from the first to the last token-carrying chunk (null: not recorded)
    concurrency: int | None = None  # requests in flight at a time when it was sent (null: a sample before levels)

    @property
    def ok(self) -> bool:
        """Answered in full: HTTP 200 (or no status recorded) and no error."""
        return self.error is None and self.status in (None, 200)

    @property
    def client_error(self) -> bool:
        """Refused with a 4xx other than 408 (timeout) and 429 (busy): the request, the key or the endpoint is
        wrong for this server (the probe traffic's rule for a refusal, ``is_client_error``)."""
        return is_client_error(self.status)

    def to_json(self) -> dict[str, Any]:
        return {
            "output_ids": list(self.output_ids),
            "decode_s_per_token": self.decode_s_per_token,
            "ttft_s": self.ttft_s,
            "spec_accept_length": self.spec_accept_length,
            "spec_verify_ct": self.spec_verify_ct,
            "completion_tokens": self.completion_tokens,
            "load": self.load,
            "host_s": self.host_s,
            "status": self.status,
            "error": self.error,
            "decode_s": self.decode_s,
            "concurrency": self.concurrency,
        }

    @classmethod
    def from_json(cls, doc: Any, where: str = "request") -> CompareRequest:
        if not isinstance(doc, Mapping):
            raise SampleError(f"{where}: must be a JSON object")
        _check_keys(where, doc, _REQUEST_KEYS, _REQUIRED_REQUEST_KEYS)
        ids = _output_ids(f"{where}.output_ids", doc["output_ids"])
        completion = _nonneg_int(f"{where}.completion_tokens", doc.get("completion_tokens"), MAX_OUTPUT_IDS)
        status = _http_status(f"{where}.status", doc.get("status"))
        error = _error(f"{where}.error", doc.get("error"))
        return cls(
            output_ids=ids,
            decode_s_per_token=_seconds(f"{where}.decode_s_per_token", doc["decode_s_per_token"]),
            ttft_s=_seconds(f"{where}.ttft_s", doc["ttft_s"]),
            spec_accept_length=_nonneg_float(f"{where}.spec_accept_length", doc["spec_accept_length"], 1e6),
            spec_verify_ct=_nonneg_int(f"{where}.spec_verify_ct", doc.get("spec_verify_ct"), 2**31 - 1),
            completion_tokens=len(ids) if completion is None else completion,
            load=_nonneg_float(f"{where}.load", doc.get("load"), 1e9),
            host_s=_seconds(f"{where}.host_s", doc.get("host_s")),
            status=status,
            error=error,
            decode_s=_seconds(f"{where}.decode_s", doc.get("decode_s")),
            concurrency=_concurrency(f"{where}.concurrency", doc.get("concurrency")),
        )


@dataclass(frozen=True)
class ComparisonSample:
    """The comparison workload's requests on one release, in workload order (warmup excluded), and where the load
    figures came from (``"metrics"``: the server's ``/metrics``; None: it exposes none)."""

    requests: tuple[CompareRequest, ...]
    load_source: Literal["metrics"] | None = None

    @property
    def answered(self) -> tuple[CompareRequest, ...]:
        return tuple(r for r in self.requests if r.ok)

    def to_json(self) -> dict[str, Any]:
        return {"requests": [r.to_json() for r in self.requests], "load_source": self.load_source}

    @classmethod
    def from_json(cls, doc: Any) -> ComparisonSample:
        """A sample from untrusted JSON (already decoded); SampleError naming the field when it is not one."""
        if not isinstance(doc, Mapping):
            raise SampleError("sample: must be a JSON object with requests[]")
        _check_keys("sample", doc, _SAMPLE_KEYS)
        raw = doc.get("requests")
        if not isinstance(raw, list):
            raise SampleError("requests: must be a list")
        if len(raw) > MAX_REQUESTS:
            raise SampleError(f"requests: more than {MAX_REQUESTS} requests")
        source = doc.get("load_source")
        if source is not None and source not in LOAD_SOURCES:
            raise SampleError(f"load_source: must be one of {', '.join(LOAD_SOURCES)} or null")
        return cls(
            requests=tuple(CompareRequest.from_json(item, f"requests[{i}]") for i, item in enumerate(raw)),
            load_source=source,
        )
