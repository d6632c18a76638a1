"""Capture size and overhead (docs/capture.md, "Figures").

    .venv/bin/python backend/bench/capture_bench.py [--prefixes 8192,32768] [--steps 5]          # CPU, eager
    python3 backend/bench/capture_bench.py --graph [--prefixes 8192,32768] [--steps 200]       # CUDA graphs

``--graph`` (a CUDA GPU and the built extension): the verify step replayed from a CUDA graph with the kernel
(3 layers), per step: prepare (the out-graph hook) + replay + synchronize, wall clock, and the replay alone
(CUDA events), for capture off (no capture slots in the graph), present but not armed (the slots behind a
conditional node, and written on every replay as on a device without them), and armed (3 layers captured per
step). The rest of this docstring is the CPU mode.

For the K2.6 shape (bs=1, q_len 9, 8 heads per TP rank, 576/512 dims, bf16 pool) it prints, per prefix:
  * the bytes one captured call (one layer of one step) stores, measured on disk and from the format's formula;
  * the verify step's time through the real VerifyEngine (3 layers, reference attention) with capture off
    (no state directory), present but not armed, and armed (3 layers captured), main thread only: the writer
    thread's hashing and file writes run beside it;
  * the per-step cost of the unarmed check alone (Capturer.armed(), no poll due) and of one poll of the
    request file;
  * the time the capture replay (kdtree_backend.replay_captures, reference path) takes per stored call.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO / "kernel"), str(REPO / "backend"), str(REPO)]

from kdtree_backend.batch import make_verify_batch  # noqa: E402
from kdtree_backend.capture import Capturer  # noqa: E402
from kdtree_backend.capture_format import REQUEST_FILE  # noqa: E402
from kdtree_backend.config import ParityConfig  # noqa: E402
from kdtree_backend.engine import VerifyEngine  # noqa: E402
from kdtree_backend.replay_captures import replay_captures  # noqa: E402

Q_LEN, HEADS, LAYERS = 9, 8, (0, 30, 60)
ARMED_STEPS = 10  # --graph: armed steps timed (each stores 3 calls: ~115 MB at prefix 32k)


def formula(prefix: int, bs: int = 1, q_len: int = Q_LEN, heads: int = HEADS, pool_bytes: int = 2) -> int:
    """Tensor bytes of one call (safetensors headers and the manifest come on top: ~3 KB)."""
    t, keys = bs * q_len, bs * prefix + bs * q_len
    inputs = t * heads * 576 * 2 + keys * 576 * pool_bytes + keys * 4 + 2 * (bs + 1) * 4 + t * ((q_len + 63) // 64) * 8
    sglang = (bs + 1) * 4 + bs * prefix * 4 + t * 8 + t * (prefix + q_len) + (bs + 1) * 8 + bs * 8 + (bs + 1) * 4
    output = t * heads * 512 * 2
    return inputs + sglang + output


def engine_step(engine: VerifyEngine, batch, out: torch.Tensor) -> float:  # type: ignore[no-untyped-def]
    start = time.perf_counter()
    engine.prepare(
        **batch.metadata(),
        graph=False,
    )
    for layer in LAYERS:
        engine.forward(layer, batch.q[layer], batch.kv_buffers[layer], out, batch.sm_scale)
    return time.perf_counter() - start


def measure(prefix: int, steps: int) -> dict[str, object]:
    batch = make_verify_batch(bs=1, prefix=prefix, q_len=Q_LEN, heads=HEADS, layers=LAYERS, seed=1)
    out = torch.empty(Q_LEN, HEADS, 512, dtype=torch.bfloat16)
    result: dict[str, object] = {"prefix": prefix, "formula_bytes": formula(prefix)}
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp) / "capture"
        directory.mkdir()
        times: dict[str, list[float]] = {}
        for mode in ("off", "unarmed", "armed"):
            capturer = Capturer(None if mode == "off" else directory, release="bench", poll_s=1.0, log=lambda _: None)
            if mode == "armed":
                arm_request(directory, steps + 1)
            engine = VerifyEngine(
                q_len=Q_LEN, heads=HEADS, parity=ParityConfig(False, 1, ()), use_kernel=False, sink=lambda _: None,
                capturer=capturer,
            )  # fmt: skip
            engine_step(engine, batch, out)  # warm-up (armed: the poll that arms it, and the first captured step)
            times[mode] = [engine_step(engine, batch, out) for _ in range(steps)]
            capturer.drain()
        calls = sorted(p for p in (directory / "c20260601T120000Z-0a1b2c").glob("tp0-*") if p.is_dir())
        sizes = [sum(f.stat().st_size for f in c.iterdir()) for c in calls]
        result["calls"] = len(calls)
        start = time.perf_counter()
        replayed = replay_captures(directory, torch.device("cpu"), threshold=0.05, sink=lambda _: None)
        result["replay_s_per_call"] = round((time.perf_counter() - start) / max(replayed.calls, 1), 3)
        result["replay_worst_rel"] = replayed.worst_rel
        result["bytes_per_call_on_disk"] = statistics.median(sizes) if sizes else None
        for mode, values in times.items():
            result[f"step_ms_{mode}"] = round(statistics.median(values) * 1e3, 3)
        # The unarmed per-step check alone, and one poll of the (missing) request file.
        result["unarmed_check_ns"] = unarmed_check_ns(directory)
        polling = Capturer(directory / "never", release="bench", poll_s=0.0, log=lambda _: None)
        start = time.perf_counter()
        for _ in range(2000):
            polling.armed()
        result["poll_us"] = round((time.perf_counter() - start) / 2000 * 1e6, 2)
    return result


def unarmed_check_ns(directory: Path, n: int = 200_000) -> float:
    """``Capturer.armed()`` not armed and no poll due: the per-step check alone."""
    idle = Capturer(directory / "never", release="bench", poll_s=3600.0, log=lambda _: None)
    idle.armed()
    start = time.perf_counter()
    for _ in range(n):
        idle.armed()
    return round((time.perf_counter() - start) / n * 1e9, 1)


def arm_request(directory: Path, steps: int) -> None:
    doc = {
        "id": "c20260601T120000Z-0a1b2c",
        "layers": list(LAYERS),
        "steps": steps,
        "max_bytes": 1 << 40,
        "expires_at": time.time() + 3600,
    }
    (directory / REQUEST_FILE).write_text(json.dumps(doc))


def measure_graph(prefix: int, steps: int) -> dict[str, object]:
    """Per-step cost under CUDA-graph replay (K2.6 shape, bs 1, 3 layers, the kernel)."""
    import kdtree_kernel
    from kdtree_backend import capture_graph as capture_module

    from tests.backend.emulation import GraphServer

    device = torch.device("cuda", torch.cuda.current_device())
    batch = make_verify_batch(bs=1, prefix=prefix, q_len=Q_LEN, heads=HEADS, layers=LAYERS, device=device, seed=1)
    max_context = prefix + Q_LEN
    result: dict[str, object] = {"prefix": prefix, "mode": "graph", "layers": len(LAYERS)}
    probed = capture_module.conditional_nodes_usable(device)
    result["conditional_nodes"] = probed
    result["conditional_nodes_why"] = capture_module.CONDITIONAL_NODES_WHY.get(str(device), "")
    with tempfile.TemporaryDirectory() as tmp:
        for mode in ("off", "unarmed", "unarmed_every_replay", "armed"):
            directory = Path(tmp) / mode
            directory.mkdir()
            capture_module._CONDITIONAL_NODES[str(device)] = probed and mode != "unarmed_every_replay"
            where = None if mode == "off" else directory
            # Armed: the request is looked at on the first step; else the check stays on its cheap path.
            capturer = Capturer(where, release="bench", poll_s=0.0 if mode == "armed" else 1.0, log=lambda _: None)
            engine = VerifyEngine(
                q_len=Q_LEN, heads=HEADS, parity=ParityConfig(False, 1, LAYERS), use_kernel=True, sink=lambda _: None,
                capturer=capturer,
            )  # fmt: skip
            server = GraphServer(
                engine, batch, max_context=max_context,
                workspace_bytes=kdtree_kernel.workspace_size(1, Q_LEN, HEADS, max_context),
            )  # fmt: skip
            server.load(batch)
            for layer in LAYERS:  # the drafts in place, as after the replay's own writes
                server.pools[layer].copy_(batch.kv_buffers[layer])
            warm = 5
            measured = min(steps, ARMED_STEPS) if mode == "armed" else steps
            if mode == "armed":
                arm_request(directory, warm + measured)
            # Per step: wall (prepare + replay + synchronize), the replay alone, and what the prepare did: began a
            # captured step ("begin"), handed the previous one over ("flush"), both, or neither ("plain").
            walls: dict[str, list[float]] = {}
            replays: list[float] = []
            start_event, end_event = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            began = time.perf_counter()
            for index in range(warm + measured):
                torch.cuda.synchronize()
                flushing = capturer.graph_step_pending
                steps_before = capturer.progress.steps if capturer.progress is not None else 0
                start = time.perf_counter()
                server.prepare()
                start_event.record()
                server.replay()
                end_event.record()
                torch.cuda.synchronize()
                wall = time.perf_counter() - start
                beginning = capturer.progress is not None and capturer.progress.steps > steps_before
                label = "+".join(n for n, on in (("flush", flushing), ("begin", beginning)) if on) or "plain"
                if index >= warm or mode == "armed":
                    walls.setdefault(label, []).append(wall)
                    replays.append(start_event.elapsed_time(end_event) * 1e-3)
            server.prepare()  # hands the last armed step over
            torch.cuda.synchronize()
            capturer.drain()
            result[f"replay_us_{mode}"] = round(statistics.median(replays) * 1e6, 2)
            for label, values in walls.items():
                suffix = "" if label == "plain" else f"_{label}"
                result[f"step_us_{mode}{suffix}"] = round(statistics.median(values) * 1e6, 1)
                if mode == "armed":
                    result[f"steps_{mode}{suffix}"] = len(values)
            if mode == "armed":
                calls = sorted(p for p in (directory / "c20260601T120000Z-0a1b2c").glob("tp0-*") if p.is_dir())
                result["armed_calls"] = len(calls)
                result["bytes_per_call_on_disk"] = sum(f.stat().st_size for f in calls[0].iterdir()) if calls else None
                result["armed_until_written_s"] = round(time.perf_counter() - began, 3)
        capture_module._CONDITIONAL_NODES.pop(str(device), None)
    result["unarmed_check_ns"] = unarmed_check_ns(Path(tempfile.gettempdir()))
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prefixes", default="8192,32768")
    parser.add_argument("--steps", type=int, default=None, help="steps per mode (default: 5 on CPU, 200 --graph)")
    parser.add_argument("--graph", action="store_true", help="CUDA-graph replay on the GPU with the kernel")
    args = parser.parse_args()
    torch.set_num_threads(1)
    for prefix in (int(p) for p in args.prefixes.split(",")):
        if args.graph:
            print(json.dumps(measure_graph(prefix, args.steps or 200)), flush=True)
        else:
            print(json.dumps(measure(prefix, args.steps or 5)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
