"""GPU: capture from the backend's verify path with the CUDA kernel (eager), replay with the kernel (rel <= 1e-2
against the fp32 attention, and against the output the capturing run returned), the classic bug caught by the
capture replay, and a CUDA-graph step (capture not supported there yet) reported as such with the output unchanged.
Skipped without a CUDA GPU or without the built extension."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
import torch
from kdtree_backend.batch import dense_verify_attention, make_verify_batch
from kdtree_backend.capture import REQUEST_FILE, Capturer
from kdtree_backend.config import ParityConfig
from kdtree_backend.engine import VerifyEngine
from kdtree_backend.replay_captures import find_calls, load_call, replay_captures
from kdtree_backend.verify import kernel_usable, parity_stats

from .helpers import PYTHON, REPO, buggy_release, replay_env

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
CAPTURE_ID = "c20260601T120000Z-0a1b2c"
BS, PREFIX, Q_LEN, HEADS, LAYERS = 4, 700, 9, 8, (0, 30)


def require_kernel() -> None:
    usable, reason = kernel_usable(torch.device("cuda"))
    if not usable:
        pytest.skip(f"kdtree CUDA extension not usable here ({reason}): build it with deploy/build_extension.py")


def arm(directory: Path, steps: int = 2) -> None:
    directory.mkdir(parents=True)
    doc = {
        "id": CAPTURE_ID,
        "layers": list(LAYERS),
        "steps": steps,
        "max_bytes": 10**9,
        "expires_at": time.time() + 600,
    }
    (directory / REQUEST_FILE).write_text(json.dumps(doc))


def eager_steps(directory: Path | None, steps: int) -> tuple[list[torch.Tensor], Capturer]:
    capturer = Capturer(directory, release="rgpu", tp=0, poll_s=0.0, log=lambda _: None)
    engine = VerifyEngine(
        q_len=Q_LEN,
        heads=HEADS,
        parity=ParityConfig(False, 1, ()),
        use_kernel=True,
        sink=lambda _: None,
        capturer=capturer,
    )
    outs = []
    for step in range(steps):
        batch = make_verify_batch(
            bs=BS, prefix=PREFIX, q_len=Q_LEN, heads=HEADS, layers=LAYERS, device="cuda", seed=step
        )
        engine.prepare(
            **batch.metadata(),
            graph=False,
            prefix_sum=int(batch.seq_lens.sum()),
            max_prefix_len=int(batch.seq_lens.max()),
        )
        for layer in LAYERS:
            out = torch.empty(BS * Q_LEN, HEADS, 512, dtype=torch.bfloat16, device="cuda")
            engine.forward(layer, batch.q[layer], batch.kv_buffers[layer], out, batch.sm_scale)
            outs.append(out.clone())
    torch.cuda.synchronize()
    capturer.drain()
    return outs, capturer


def test_eager_capture_with_the_kernel_replays_within_1e_2(tmp_path: Path) -> None:
    require_kernel()
    directory = tmp_path / "capture"
    arm(directory, steps=2)
    outs, _ = eager_steps(directory, steps=3)
    plain, _ = eager_steps(None, steps=3)
    assert all(torch.equal(a, b) for a, b in zip(outs, plain, strict=True))  # capture never changes the output
    calls = find_calls(directory)
    assert len(calls) == 4
    first = load_call(calls[0])
    assert first.manifest["device"].startswith("cuda") and first.manifest["keys_outside_rows"] == 0
    assert torch.equal(first.output["out"], outs[0].cpu())  # step 0, layer 0: what the kernel returned
    lines: list[str] = []
    summary = replay_captures(directory, torch.device("cuda"), threshold=1e-2, sink=lines.append)
    assert summary.calls == 4 and summary.worst_rel <= 1e-2, lines
    for line in lines:
        fields = dict(kv.split("=", 1) for kv in line.split()[2:])
        assert fields["path"] == "kernel" and float(fields["vs_running"]) <= 1e-2, line


def test_classic_bug_caught_by_the_capture_replay_on_gpu(tmp_path: Path) -> None:
    require_kernel()
    directory = tmp_path / "capture"
    arm(directory, steps=1)
    eager_steps(directory, steps=1)
    env = replay_env(buggy_release("drafts", tmp_path))
    env["KDTREE_EXT_DIR"] = os.environ.get("KDTREE_EXT_DIR", str(REPO / "kernel" / "build"))
    res = subprocess.run(
        [PYTHON, "-m", "kdtree_backend.replay", "--captures", str(directory), "--threshold", "0.05"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 3, res.stdout + res.stderr
    assert "path=kernel" in res.stdout and "captures=2 damaged=0" in res.stdout


def test_cuda_graph_step_is_reported_unsupported_and_the_output_unchanged(tmp_path: Path) -> None:
    require_kernel()
    import kdtree_kernel

    directory = tmp_path / "capture"
    arm(directory)
    capturer = Capturer(directory, release="rgpu", tp=0, poll_s=0.0, log=lambda _: None)
    engine = VerifyEngine(
        q_len=Q_LEN,
        heads=HEADS,
        parity=ParityConfig(False, 1, ()),
        use_kernel=True,
        sink=lambda _: None,
        capturer=capturer,
    )
    max_context = PREFIX + Q_LEN
    engine.allocate_graph_buffers(
        max_bs=BS,
        max_context_len=max_context,
        device=torch.device("cuda"),
        workspace_bytes=kdtree_kernel.workspace_size(BS, Q_LEN, HEADS, max_context),
    )
    static = make_verify_batch(bs=BS, prefix=PREFIX, q_len=Q_LEN, heads=HEADS, layers=LAYERS, device="cuda", seed=0)
    kv_indices = torch.zeros(BS * max_context, dtype=torch.long, device="cuda")
    custom_mask = torch.zeros(BS * Q_LEN * (max_context + Q_LEN), dtype=torch.uint8, device="cuda")
    outs = {layer: torch.empty(BS * Q_LEN, HEADS, 512, dtype=torch.bfloat16, device="cuda") for layer in LAYERS}

    def load(batch) -> None:  # type: ignore[no-untyped-def]
        static.kv_indptr.copy_(batch.kv_indptr)
        kv_indices[: batch.kv_indices.numel()].copy_(batch.kv_indices)
        custom_mask[: batch.custom_mask.numel()].copy_(batch.custom_mask)
        static.mask_indptr.copy_(batch.mask_indptr)
        static.out_cache_loc.copy_(batch.out_cache_loc)
        for layer in LAYERS:
            static.q[layer].copy_(batch.q[layer])
            static.kv_buffers[layer].copy_(batch.kv_buffers[layer])

    def prepare(capture: bool) -> None:
        engine.prepare(
            kv_indptr=static.kv_indptr,
            kv_indices=kv_indices,
            out_cache_loc=static.out_cache_loc,
            custom_mask=custom_mask,
            mask_indptr=static.mask_indptr,
            qo_indptr=static.qo_indptr.long(),
            bs=BS,
            graph=True,
            capture=capture,
            kv_buffer_shape=static.kv_buffers[0].shape,
        )

    def forward() -> None:
        for layer in LAYERS:
            engine.forward(layer, static.q[layer], static.kv_buffers[layer], outs[layer], static.sm_scale)

    load(static)
    prepare(capture=True)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        forward()
    rels = []
    for index in range(3):
        batch = make_verify_batch(
            bs=BS, prefix=PREFIX, q_len=Q_LEN, heads=HEADS, layers=LAYERS, device="cuda", seed=50 + index
        )
        load(batch)
        prepare(capture=False)
        graph.replay()
        rels += [parity_stats(outs[layer], dense_verify_attention(batch, layer))[2] for layer in LAYERS]
    torch.cuda.synchronize()
    capturer.drain()
    assert max(rels) <= 1e-2
    done = json.loads((directory / CAPTURE_ID / "tp0.done.json").read_text())
    assert done["reason"] == "cuda_graphs_unsupported" and done["calls"] == 0
