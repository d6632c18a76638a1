"""Safetensors files without the ``safetensors`` package (testbed hosts and bare GPU hosts may lack it; torch is
all the backend may assume). The format (https://huggingface.co/docs/safetensors): an 8-byte little-endian header
length N, N bytes of JSON ``{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {str: str}}``
padded with spaces to a multiple of 8, then the tensors' bytes back to back (offsets relative to the end of the
header, no holes). Files written here load with ``safetensors.torch.load_file`` and the other way round (the tests
check both directions where the package is installed).

Pure apart from the file I/O of :func:`write_tensors` / :func:`read_tensors`; :func:`encode` / :func:`decode` work
on bytes.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

DTYPES: dict[torch.dtype, str] = {
    torch.bool: "BOOL",
    torch.uint8: "U8",
    torch.int8: "I8",
    torch.int16: "I16",
    torch.int32: "I32",
    torch.int64: "I64",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.float32: "F32",
    torch.float64: "F64",
    torch.float8_e4m3fn: "F8_E4M3",
    torch.float8_e5m2: "F8_E5M2",
}
_BY_NAME = {name: dtype for dtype, name in DTYPES.items()}
MAX_HEADER = 100 * 1024 * 1024  # the reference implementation's own bound


class TensorFileError(ValueError):
    """A file that is not a well-formed safetensors file (or a tensor this codec cannot store)."""


def _raw(t: torch.Tensor) -> bytes:
    flat = t.detach().to("cpu").contiguous().reshape(-1)
    if flat.numel() == 0:
        return b""
    return flat.view(torch.uint8).numpy().tobytes()


def encode(tensors: Mapping[str, torch.Tensor], metadata: Mapping[str, str] | None = None) -> bytes:
    """The file's bytes. Tensors are laid out in the order given."""
    header: dict[str, object] = {}
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    chunks: list[bytes] = []
    offset = 0
    for name, tensor in tensors.items():
        if name == "__metadata__":
            raise TensorFileError("'__metadata__' is reserved and cannot name a tensor")
        dtype = DTYPES.get(tensor.dtype)
        if dtype is None:
            raise TensorFileError(f"tensor {name!r}: dtype {tensor.dtype} has no safetensors name")
        raw = _raw(tensor)
        header[name] = {"dtype": dtype, "shape": list(tensor.shape), "data_offsets": [offset, offset + len(raw)]}
        chunks.append(raw)
        offset += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + b"".join(chunks)


def _split_header(data: bytes) -> tuple[dict[str, Any], memoryview]:
    """The header's JSON object and the bytes after it (the tensors' data)."""
    if len(data) < 8:
        raise TensorFileError(f"{len(data)} bytes: too short for a safetensors header")
    (size,) = struct.unpack("<Q", data[:8])
    if size > MAX_HEADER or 8 + size > len(data):
        raise TensorFileError(f"header length {size} does not fit the {len(data)}-byte file")
    try:
        header = json.loads(data[8 : 8 + size])
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise TensorFileError(f"header is not JSON: {exc}") from None
    if not isinstance(header, dict):
        raise TensorFileError("header is not a JSON object")
    return header, memoryview(data)[8 + size :]


def _element_count(name: str, shape: list[int]) -> int:
    count = 1
    for d in shape:
        if d < 0:
            raise TensorFileError(f"tensor {name!r}: negative dimension in {shape}")
        count *= d
    return count


def _decode_tensor(name: str, info: Any, body: memoryview) -> tuple[torch.Tensor, tuple[int, int]]:
    """One header entry's tensor, and the span of ``body`` it takes."""
    try:
        dtype = _BY_NAME[info["dtype"]]
        shape = [int(d) for d in info["shape"]]
        begin, end = (int(x) for x in info["data_offsets"])
    except (KeyError, TypeError, ValueError):
        raise TensorFileError(f"tensor {name!r}: bad entry {info!r}") from None
    itemsize = torch.empty((), dtype=dtype).element_size()
    count = _element_count(name, shape)
    if not 0 <= begin <= end <= len(body) or end - begin != count * itemsize:
        raise TensorFileError(f"tensor {name!r}: offsets {begin}..{end} do not hold {shape} {info['dtype']}")
    if count == 0:
        return torch.empty(shape, dtype=dtype), (begin, end)
    raw = torch.frombuffer(bytearray(body[begin:end]), dtype=torch.uint8)
    return raw.view(dtype).reshape(shape), (begin, end)


def _check_packed(spans: list[tuple[int, int]], body_bytes: int) -> None:
    """The tensors' spans cover the data back to back: no hole, no overlap, nothing after the last."""
    cursor = 0
    for begin, end in sorted(spans):
        if begin != cursor:
            raise TensorFileError(f"tensor data has a hole or an overlap at byte {cursor}")
        cursor = end
    if cursor != body_bytes:
        raise TensorFileError(f"{body_bytes - cursor} bytes after the last tensor")


def decode(data: bytes) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """(tensors, metadata) from a file's bytes; raises :class:`TensorFileError` on anything malformed."""
    header, body = _split_header(data)
    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise TensorFileError("__metadata__ must map strings to strings")
    tensors: dict[str, torch.Tensor] = {}
    spans: list[tuple[int, int]] = []
    for name, info in header.items():
        tensors[name], span = _decode_tensor(name, info, body)
        spans.append(span)
    _check_packed(spans, len(body))
    return tensors, dict(metadata)


def write_tensors(
    path: Path, tensors: Mapping[str, torch.Tensor], metadata: Mapping[str, str] | None = None, *, mode: int = 0o600
) -> tuple[int, str]:
    """Write a new file (never over an existing one) with ``mode``, fsync'ed. Returns (bytes, sha256 hex)."""
    data = encode(tensors, metadata)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        os.fchmod(fd, mode)  # whatever the umask
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    return len(data), hashlib.sha256(data).hexdigest()


def read_tensors(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, str], str]:
    """(tensors, metadata, sha256 hex of the file)."""
    data = Path(path).read_bytes()
    tensors, metadata = decode(data)
    return tensors, metadata, hashlib.sha256(data).hexdigest()
