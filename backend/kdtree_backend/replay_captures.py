"""Replay stored captures (kdtree_backend.capture) with *this* release's verify path and print parity lines.

    PYTHONPATH=<release>/kernel:<release>/backend python3 -m kdtree_backend.replay --captures <root>/state/capture \\
        [--threshold REL] [--device auto|cpu|cuda]

For each stored call (one layer of one verify step on one TP rank), this release marshals SGLang's captured
metadata (:func:`kdtree_backend.verify.marshal_verify`) and runs its verify path on the captured rows (the kernel
on CUDA when the extension is built, else the reference), then compares:

  * with an independent fp32 attention computed straight from SGLang's layout on the captured inputs
    (``rel``: the number the gate judges);
  * with the output the running release returned when the call was captured (``vs_running``), and that output
    with the fp32 attention (``running_rel``: was the running release right?).

One line per call, in the format of :func:`kdtree_backend.lines.format_parity`:

    [kdtree] L30 max_abs_diff=... mean=... rel=... tp=1 token=... capture=c20260601T120000Z-0a1b2c/tp1-L30-s0
        vs_running=... running_rel=... path=kernel

``tp=`` is the rank that captured the call (so a deploy judges these lines with the host's TP size). A call whose
files do not match their manifest's sha256 is not replayed: it prints a ``kdtree-replay: capture ... skipped``
line on stderr and counts as a failure with ``--threshold``. Exit: 0 (every line within the threshold, or no
captures stored: ``captures=0`` in the last line), 3 (a line over the threshold, or a damaged capture), 2 (usage).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .capture_format import CALL_RE, FILES, FORMAT, CaptureError
from .lines import ParityIdentity, emit, format_parity
from .tensorfile import TensorFileError, read_tensors
from .verify import attend, kernel_usable, marshal_verify, parity_stats
from .wire import REPLAY_EXIT_OK, REPLAY_EXIT_PARITY_FAILED, REPLAY_EXIT_USAGE


@dataclass
class StoredCall:
    path: Path
    manifest: dict[str, Any]
    inputs: dict[str, torch.Tensor]
    sglang: dict[str, torch.Tensor]
    output: dict[str, torch.Tensor]

    @property
    def label(self) -> str:
        return f"{self.manifest['capture']}/{self.path.name}"


@dataclass(frozen=True)
class CallResult:
    label: str
    layer: int
    tp: int
    max_abs_diff: float
    mean: float
    rel: float
    vs_running: float
    running_rel: float


def find_calls(root: Path) -> list[Path]:
    """Every complete call under ``root``: the capture directory, one capture, or one call (a directory with a
    manifest.json; half-written ``.partial`` directories are left out). Sorted by capture, rank, layer, step."""
    root = Path(root)
    if (root / "manifest.json").is_file():
        return [root]
    found = [p.parent for p in root.glob("*/manifest.json")] + [p.parent for p in root.glob("*/*/manifest.json")]

    def key(p: Path) -> tuple[str, int, int, int]:
        m = CALL_RE.fullmatch(p.name)
        nums = (int(m[1]), int(m[2]), int(m[3])) if m else (0, 0, 0)
        return (p.parent.name, *nums)

    return sorted((p for p in set(found) if not p.name.startswith(".") and CALL_RE.fullmatch(p.name)), key=key)


def load_call(path: Path) -> StoredCall:
    """A call's tensors, each file checked against the manifest's sha256 (a mismatch is a CaptureError)."""
    try:
        manifest = json.loads((path / "manifest.json").read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise CaptureError(f"{path}/manifest.json: unreadable: {exc}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise CaptureError(f"{path}/manifest.json: not a {FORMAT} manifest")
    files = manifest.get("files")
    if not isinstance(files, dict):
        raise CaptureError(f"{path}/manifest.json: no files")
    groups: dict[str, dict[str, torch.Tensor]] = {}
    for stem in FILES:
        name = f"{stem}.safetensors"
        want = files.get(name, {}).get("sha256") if isinstance(files.get(name), dict) else None
        if not want:
            raise CaptureError(f"{path}/{name}: not in the manifest")
        try:
            tensors, _, digest = read_tensors(path / name)
        except (OSError, TensorFileError) as exc:
            raise CaptureError(f"{path}/{name}: {exc}") from None
        if digest != want:
            raise CaptureError(f"{path}/{name}: sha256 {digest[:12]}... does not match the manifest's {want[:12]}...")
        groups[stem] = tensors
    return StoredCall(path, manifest, groups["inputs"], groups["sglang"], groups["output"])


def dense_reference(call: StoredCall, device: torch.device | str = "cpu") -> torch.Tensor:
    """fp32 attention straight from SGLang's captured layout, independent of the release's marshaling: request
    ``b`` reads its prefix rows ``kv_indices[kv_indptr[b]:kv_indptr[b+1]]`` then its drafts ``out_cache_loc``, under
    its ``[q_len, prefix + q_len]`` block of ``custom_mask``. Returns float32 ``[T, H, Dv]``."""
    m, s = call.manifest, call.sglang
    q_len, dv = int(m["q_len"]), int(m["v_head_dim"])
    q = call.inputs["q"].to(device).float()
    rows = call.inputs["kv_rows"].to(device)
    pool = rows.reshape(rows.shape[0], -1).float()
    keys_all, values_all = pool * float(m["k_scale"]), pool[:, :dv] * float(m["v_scale"])
    kv_ptr, mask_ptr = s["kv_indptr"].tolist(), s["mask_indptr"].tolist()
    out = torch.zeros(q.shape[0], q.shape[1], dv, dtype=torch.float32, device=device)
    for b in range(len(kv_ptr) - 1):
        prefix = kv_ptr[b + 1] - kv_ptr[b]
        drafts = s["out_cache_loc"][b * q_len : (b + 1) * q_len]
        idx = torch.cat([s["kv_indices"][kv_ptr[b] : kv_ptr[b + 1]].long(), drafts.long()]).to(device)
        visible = s["custom_mask"][mask_ptr[b] : mask_ptr[b + 1]].to(device).view(q_len, prefix + q_len) != 0
        queries = q[b * q_len : (b + 1) * q_len]
        scores = torch.einsum("thd,sd->ths", queries, keys_all[idx]) * float(m["sm_scale"])
        scores = scores.masked_fill(~visible[:, None, :], float("-inf"))
        out[b * q_len : (b + 1) * q_len] = torch.einsum("ths,sd->thd", torch.softmax(scores, -1), values_all[idx])
    return out


def replay_call(call: StoredCall, device: torch.device, use_kernel: bool) -> CallResult:
    """This release's verify path on the captured call, and the three comparisons."""
    m, s = call.manifest, call.sglang
    q_len = int(m["q_len"])
    q = call.inputs["q"].to(device)
    rows = call.inputs["kv_rows"].to(device)
    meta = marshal_verify(
        s["kv_indptr"].to(device),
        s["kv_indices"].to(device),
        s["out_cache_loc"].to(device),
        s["custom_mask"].to(device),
        s["mask_indptr"].to(device),
        q_len,
    )
    qo_indptr = s["qo_indptr"].to(device).to(torch.int32)
    prefix_max = int((s["kv_indptr"][1:] - s["kv_indptr"][:-1]).max()) if s["kv_indptr"].numel() > 1 else 0
    dtype = call.output["out"].dtype
    out = torch.empty(q.shape[0], q.shape[1], int(m["v_head_dim"]), dtype=dtype, device=device)
    attend(
        q,
        rows,
        meta,
        qo_indptr,
        float(m["sm_scale"]),
        use_kernel=use_kernel,
        out=out,
        max_prefix_len=prefix_max,
        v_head_dim=int(m["v_head_dim"]),
        k_scale=float(m["k_scale"]),
        v_scale=float(m["v_scale"]),
    )
    ref = dense_reference(call, device)
    running = call.output["out"].to(device)
    max_abs, mean, rel = parity_stats(out, ref)
    _, _, vs_running = parity_stats(out, running)
    _, _, running_rel = parity_stats(running, ref)
    return CallResult(call.label, int(m["layer"]), int(m["tp"]), max_abs, mean, rel, vs_running, running_rel)


def format_result(result: CallResult, token_source: ParityIdentity, path: str) -> str:
    identity = ParityIdentity(tp=result.tp, token=token_source.token)
    return format_parity(
        result.layer,
        result.max_abs_diff,
        result.mean,
        result.rel,
        identity,
        capture=result.label,
        vs_running=f"{result.vs_running:.4e}",
        running_rel=f"{result.running_rel:.4e}",
        path=path,
    )


@dataclass
class ReplaySummary:
    calls: int = 0
    damaged: int = 0
    over_threshold: int = 0
    worst_rel: float = 0.0

    def exit_code(self, threshold: float | None) -> int:
        if threshold is None:
            return REPLAY_EXIT_OK
        return REPLAY_EXIT_PARITY_FAILED if self.damaged or self.over_threshold else REPLAY_EXIT_OK


def replay_captures(
    root: Path,
    device: torch.device,
    *,
    threshold: float | None = None,
    identity: ParityIdentity | None = None,
    sink: Callable[[str], None] = emit,
    warn: Callable[[str], None] | None = None,
) -> ReplaySummary:
    """Replay every call under ``root`` and print one parity line each (``sink``)."""
    warn = warn or (lambda text: print(text, file=sys.stderr, flush=True))
    identity = identity or ParityIdentity.from_env()
    usable, reason = kernel_usable(device)
    path = "kernel" if usable else "reference"
    summary = ReplaySummary()
    for call_dir in find_calls(root):
        try:
            call = load_call(call_dir)
        except CaptureError as exc:
            summary.damaged += 1
            warn(f"kdtree-replay: capture {call_dir.parent.name}/{call_dir.name} skipped: {exc}")
            continue
        with torch.inference_mode():
            result = replay_call(call, device, usable)
        sink(format_result(result, identity, path))
        summary.calls += 1
        summary.worst_rel = max(summary.worst_rel, result.rel)
        if threshold is not None and not result.rel <= threshold:
            summary.over_threshold += 1
    if not usable and device.type == "cuda":
        warn(f"kdtree-replay: kernel not usable ({reason}): replayed with the reference")
    return summary


def run_cli(root: Path, device: torch.device, threshold: float | None) -> int:
    """``python -m kdtree_backend.replay --captures DIR``: replay, then one summary line; the exit status."""
    if root.exists() and not root.is_dir():
        print(f"kdtree-replay: --captures {root}: not a directory", file=sys.stderr, flush=True)
        return REPLAY_EXIT_USAGE
    if not root.exists():  # nothing was ever captured on this host: nothing to replay
        print(f"kdtree-replay: no captures under {root}", file=sys.stderr, flush=True)
    if device.type == "cpu":
        torch.set_num_threads(min(4, torch.get_num_threads()))
    started = time.monotonic()
    summary = replay_captures(root, device, threshold=threshold) if root.exists() else ReplaySummary()
    code = summary.exit_code(threshold)
    print(
        f"kdtree-replay: captures={summary.calls} damaged={summary.damaged} worst_rel={summary.worst_rel:.4e} "
        f"threshold={threshold} exit={code} elapsed_s={time.monotonic() - started:.2f}",
        flush=True,
    )
    return code
