"""GPU: capture from the backend's verify path with the CUDA kernel (eager), replay with the kernel (rel <= 1e-2
against the fp32 attention, and against the output the capturing run returned), the classic bug caught by the
capture replay; and the same under CUDA-graph replay (the captured forward writes the capture slots, with and
without conditional nodes): outputs bit-identical with and without capture, every captured row as the replay read
it, replay within 1e-2, the classic bug caught. Skipped without a CUDA GPU or without the built extension."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
import torch
from kdtree_backend import capture_graph as capture_module
from kdtree_backend.batch import dense_verify_attention, make_verify_batch
from kdtree_backend.capture import Capturer
from kdtree_backend.capture_format import REQUEST_FILE
from kdtree_backend.config import ParityConfig
from kdtree_backend.engine import VerifyEngine
from kdtree_backend.replay_captures import find_calls, load_call, replay_captures
from kdtree_backend.verify import parity_stats

from tests.backend.emulation import GraphServer, rows_read
from tests.backend.helpers import PYTHON, REPO, buggy_release, replay_env
from tests.gpu_helpers import NEEDS_CUDA, require_kernel

pytestmark = list(NEEDS_CUDA)
CAPTURE_ID = "c20260601T120000Z-0a1b2c"
BS, PREFIX, Q_LEN, HEADS, LAYERS = 4, 700, 9, 8, (0, 30)


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


def replay_with_bug(directory: Path, tmp_path: Path) -> int:
    """Replay ``directory`` with a classic-bug release through the CLI on the GPU; the number of calls it failed."""
    env = replay_env(buggy_release("drafts", tmp_path))
    env["KDTREE_EXT_DIR"] = os.environ.get("KDTREE_EXT_DIR", str(REPO / "kernel" / "build"))
    res = subprocess.run(
        [PYTHON, "-m", "kdtree_backend.replay", "--captures", str(directory), "--threshold", "0.05"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    print(res.stdout)
    assert res.returncode == 3, res.stdout + res.stderr
    assert "path=kernel" in res.stdout and "captures=2 damaged=0" in res.stdout
    rels = [
        float(line.split(" rel=")[1].split()[0]) for line in res.stdout.splitlines() if line.startswith("[kdtree] L")
    ]
    return sum(rel > 0.05 for rel in rels)


def graph_steps(
    directory: Path | None, steps: int, *, conditional: bool | None = None
) -> tuple[list, list, GraphServer]:
    """Verify steps replayed from a real CUDA graph (the backend's verify path with the kernel, capture slots of
    LAYERS); ``conditional`` False: the slots written on every replay (as on a device without conditional nodes)."""
    import kdtree_kernel

    if conditional is not None:
        capture_module._CONDITIONAL_NODES[str(torch.device("cuda", torch.cuda.current_device()))] = conditional
        capture_module._CONDITIONAL_NODES["cuda"] = conditional
    capturer = Capturer(directory, release="rgpu", tp=0, poll_s=0.0, log=print)
    engine = VerifyEngine(
        q_len=Q_LEN, heads=HEADS, parity=ParityConfig(False, 1, LAYERS), use_kernel=True, sink=lambda _: None,
        capturer=capturer,
    )  # fmt: skip
    max_context = PREFIX + Q_LEN
    template = make_verify_batch(bs=BS, prefix=PREFIX, q_len=Q_LEN, heads=HEADS, layers=LAYERS, device="cuda", seed=99)
    server = GraphServer(
        engine, template, max_context=max_context,
        workspace_bytes=kdtree_kernel.workspace_size(BS, Q_LEN, HEADS, max_context),
    )  # fmt: skip
    batches = [
        make_verify_batch(bs=BS, prefix=PREFIX, q_len=Q_LEN, heads=HEADS, layers=LAYERS, device="cuda", seed=50 + i)
        for i in range(steps)
    ]
    outs = [server.step(batch, padding=1 if i == 1 else 0) for i, batch in enumerate(batches)]
    torch.cuda.synchronize()
    capturer.drain()
    return outs, batches, server


@pytest.mark.parametrize("conditional", [None, False], ids=["as-probed", "every-replay"])
def test_capture_under_cuda_graph_replay_replays_within_1e_2_and_changes_no_output(
    tmp_path: Path, conditional: bool | None
) -> None:
    require_kernel()
    saved = dict(capture_module._CONDITIONAL_NODES)
    try:
        directory = tmp_path / "capture"
        arm(directory, steps=2)
        outs, batches, server = graph_steps(directory, steps=4, conditional=conditional)
        plain, _, _ = graph_steps(None, steps=4)
    finally:
        capture_module._CONDITIONAL_NODES.clear()
        capture_module._CONDITIONAL_NODES.update(saved)
    slots = server.engine.graph.capture if server.engine.graph is not None else None
    assert slots is not None
    why = capture_module.CONDITIONAL_NODES_WHY.get(str(torch.device("cuda", torch.cuda.current_device())), "")
    print(f"capture slots: conditional nodes {slots.conditional} {why}, {slots.nbytes() / 1e6:.1f} MB")
    rels = []
    for step_outs, plain_outs, batch in zip(outs, plain, batches, strict=True):
        for layer in LAYERS:
            assert torch.equal(step_outs[layer], plain_outs[layer])  # capture never changes what the graph returns
            rels.append(parity_stats(step_outs[layer], dense_verify_attention(batch, layer))[2])
    assert max(rels) <= 1e-2, rels
    calls = find_calls(directory)
    assert [c.name for c in calls] == ["tp0-L0-s0", "tp0-L0-s1", "tp0-L30-s0", "tp0-L30-s1"]
    done = json.loads((directory / CAPTURE_ID / "tp0.done.json").read_text())
    assert done["reason"] == "steps" and done["calls"] == 4
    for call_dir in calls:
        call = load_call(call_dir)
        layer, step = call.manifest["layer"], call.manifest["step"]
        batch = batches[step]
        rows = rows_read(batch)
        assert torch.equal(call.inputs["kv_rows"], batch.kv_buffers[layer][rows].cpu())  # as the replay read them
        assert torch.equal(call.output["out"], outs[step][layer].cpu())
        assert call.manifest["graph"] is True and call.manifest["padding_requests"] == (1 if step == 1 else 0)
    lines: list[str] = []
    summary = replay_captures(directory, torch.device("cuda"), threshold=1e-2, sink=lines.append)
    print("\n".join(lines))
    assert summary.calls == 4 and summary.worst_rel <= 1e-2, lines
    for line in lines:
        fields = dict(kv.split("=", 1) for kv in line.split()[2:])
        assert fields["path"] == "kernel" and float(fields["vs_running"]) <= 1e-2, line


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "cuda-graph"])
def test_classic_bug_caught_by_the_capture_replay_on_gpu(tmp_path: Path, graph: bool) -> None:
    require_kernel()
    directory = tmp_path / "capture"
    arm(directory, steps=1)
    if graph:
        graph_steps(directory, steps=2)  # the second step hands the first one over
    else:
        eager_steps(directory, steps=1)
    assert replay_with_bug(directory, tmp_path) == 2
