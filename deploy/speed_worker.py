"""One side of the pre-restart speed check (``python3 -m kdtree_backend.speed_ab``, docs/gate.md "The pre-restart
speed check"): times ONE release's verify path on calls it is told to build or load, one command at a time.

Run by path from the NEW release (``<new>/deploy/speed_worker.py``) with the working directory and ``PYTHONPATH``
of the release it times (``<side>/kernel:<side>/backend``), so ``kdtree_backend`` and ``kdtree_kernel`` (and the
extension build under ``<side>/kernel/build``) are that release's own: the running release is timed with its own
code, through the functions every release has (``verify.marshal_verify``, ``verify.attend``,
``verify.kernel_usable``, ``batch.make_verify_batch``). It lives in ``deploy/`` and not in a package because a
script's own folder comes first on ``sys.path``, and the backend's folder holds a ``marshal.py``.

Protocol: one JSON object a line on stdin, one answer a line on stdout.
  {"op": "device"}  -> {"device": "cuda"|"cpu"} (what "auto" resolves to)
  {"op": "build", "cases": [[bs, prefix, q_len, heads], ...], "file": F, "seed": S, "tree": "tree"}
      the calls' SGLang metadata, made with this release's batch builder, saved to F (the new side does this)
  {"op": "load", "file": F, "device": "auto", "graphs": true, "dtype": "bfloat16", "seed": S}
      -> {"device", "path": "kernel"|"reference", "graphs", "calls", "call_us": [...]} (after a warm-up)
  {"op": "time", "call": I, "reps": R, "tries": K}  -> {"us": the fastest of K timings of R back-to-back calls}
An error is {"error": "..."} and the worker exits 1. EOF ends it.

Timing is what production runs: on CUDA, with the kernel, each call is captured once in a CUDA graph and the
graph is replayed, timed with CUDA events (eager when a graph cannot be captured); on CPU (the testbed's stand-in)
the reference path, timed by the worker thread's CPU time (``time.thread_time``: the testbed's cores are
shared, and the wall clock of a call grows with whatever else runs). The testbed's ``standin.fault slow:F`` in the side's own
``deploy/kdtree.json`` makes every timed CPU call F times as long (a busy wait, as the stand-in's server does), so
a slow variant is slow here too, before any restart.
"""

from __future__ import annotations

import json
import sys
import time
import traceback
from pathlib import Path
from typing import Any


def _reply(doc: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(doc) + "\n")
    sys.stdout.flush()


def _slow_factor() -> float:
    """The side's ``standin.fault slow:F`` (1.0 without one): the testbed's slow release."""
    try:
        config = json.loads(Path("deploy/kdtree.json").read_text())
        fault = (config.get("standin") or {}).get("fault") or ""
    except (OSError, ValueError, AttributeError):
        return 1.0
    kind, _, value = str(fault).partition(":")
    try:
        return max(1.0, float(value)) if kind == "slow" else 1.0
    except ValueError:
        return 1.0


class Side:
    def __init__(self) -> None:
        import torch  # here, not at the top: the worker answers a bad command line without it

        self.torch = torch
        self.calls: list[dict[str, Any]] = []
        self.slow = _slow_factor()
        self.device = None
        self.use_kernel = False
        self.graphs = False

    def build(self, cmd: dict[str, Any]) -> dict[str, Any]:
        from kdtree_backend.batch import make_verify_batch

        saved = []
        for bs, prefix, q_len, heads in cmd["cases"]:
            b = make_verify_batch(
                bs=bs, prefix=prefix, q_len=q_len, heads=heads, layers=(), tree=cmd.get("tree", "tree"),
                seed=int(cmd.get("seed", 0)),
            )  # fmt: skip
            meta = {k: v for k, v in b.metadata().items() if k != "bs"}
            saved.append({"case": [bs, prefix, q_len, heads], "sm_scale": b.sm_scale, **meta})
        self.torch.save(saved, cmd["file"])
        return {"built": len(saved)}

    def load(self, cmd: dict[str, Any]) -> dict[str, Any]:
        torch = self.torch
        from kdtree_backend.verify import kernel_usable, marshal_verify

        want = cmd.get("device", "auto")
        if want == "auto":
            want = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = torch.device(want)
        if self.device.type == "cpu":
            torch.set_num_threads(1)  # as the stand-in runs it; a host's few cores are shared
        self.use_kernel = kernel_usable(self.device)[0]
        dtype = getattr(torch, cmd.get("dtype", "bfloat16"))
        gen = torch.Generator(device=self.device).manual_seed(int(cmd.get("seed", 0)))
        self.graphs = bool(cmd.get("graphs", True)) and self.use_kernel
        for doc in torch.load(cmd["file"]):
            bs, prefix, q_len, heads = doc["case"]
            dev = {k: doc[k].to(self.device) for k in ("kv_indptr", "kv_indices", "out_cache_loc", "custom_mask",
                                                         "mask_indptr", "qo_indptr")}  # fmt: skip
            pool = int(max(dev["kv_indices"].max(), dev["out_cache_loc"].max())) + 1
            kv = torch.randn(pool, 1, 576, generator=gen, device=self.device).to(dtype)
            q = torch.randn(bs * q_len, heads, 576, generator=gen, device=self.device).to(dtype)
            meta = marshal_verify(
                dev["kv_indptr"], dev["kv_indices"], dev["out_cache_loc"], dev["custom_mask"], dev["mask_indptr"],
                q_len,
            )  # fmt: skip
            call = {"case": doc["case"], "q": q, "kv": kv, "meta": meta, "qo": dev["qo_indptr"],
                    "scale": float(doc["sm_scale"]), "prefix": prefix}  # fmt: skip
            call["run"] = self._runner(call)
            self.calls.append(call)
        times = [self._once(i) for i in range(len(self.calls)) for _ in range(3)][2::3]  # warm-up, 3 each
        return {"device": str(self.device), "path": "kernel" if self.use_kernel else "reference",
                "graphs": self.graphs, "calls": len(self.calls), "call_us": times, "slow": self.slow}  # fmt: skip

    def _runner(self, call: dict[str, Any]) -> Any:
        from kdtree_backend.verify import attend

        torch = self.torch
        q, kv, meta, qo, scale = call["q"], call["kv"], call["meta"], call["qo"], call["scale"]
        if not self.use_kernel:
            return lambda: attend(q, kv, meta, qo, scale, use_kernel=False)
        import kdtree_kernel

        bs, prefix, q_len, heads = call["case"]
        # Held by the call, not only by the closure below: a captured graph writes into these addresses at every
        # replay, and memory the allocator got back would be handed to the next call's tensors.
        out = call["out"] = torch.empty(q.shape[0], heads, 512, dtype=q.dtype, device=q.device)
        need = int(kdtree_kernel.workspace_size(bs, q_len, heads, prefix, q.device))
        ws = call["workspace"] = torch.empty(max(need, 1), dtype=torch.uint8, device=q.device)

        def eager() -> Any:
            return attend(q, kv, meta, qo, scale, use_kernel=True, out=out, workspace=ws, max_prefix_len=prefix,
                          validate=False)  # fmt: skip

        if not self.graphs:
            return eager
        try:
            eager()  # plans and loads before the capture
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                eager()
            call["graph"] = graph
            return graph.replay
        except Exception:  # an older release whose call cannot be captured: timed eager, as it would serve
            self.graphs = False
            return eager

    def _once(self, index: int) -> float:
        return self.time(index, 1)

    def time(self, index: int, reps: int, tries: int = 1) -> float:
        """Mean microseconds of ``reps`` back-to-back calls, the fastest of ``tries`` such timings: another
        process on the host only ever adds time, so the fastest is the one closest to the call's own. The
        ``reps`` calls before them are not timed: the first calls after the worker has waited for its next command
        ran up to 1.7x as long on the testbed's CPU (caches the other side's worker had taken), more in one
        worker than in the other: an A/A check measured 0.81x."""
        self._time(index, reps)
        return min(self._time(index, reps) for _ in range(max(1, tries)))

    def _time(self, index: int, reps: int) -> float:
        torch = self.torch
        run = self.calls[index]["run"]
        if self.device is not None and self.device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            start.record()
            for _ in range(reps):
                run()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) * 1000.0 / reps
        # The CPU path runs in this thread (one intra-op thread): its own CPU time is the call's cost, and unlike
        # the wall clock it does not grow while other processes hold the host's few cores.
        clock = time.thread_time
        with torch.inference_mode():
            t0 = clock()
            for _ in range(reps):
                run()
            took = clock() - t0
            if self.slow > 1.0:  # busy, as a slower kernel is (docs/testbed.md, slow:F)
                until = t0 + self.slow * took
                while clock() < until:
                    pass
                took = clock() - t0
        return took * 1e6 / reps


def main() -> int:
    try:
        side = Side()
    except Exception as e:
        _reply({"error": f"cannot start: {type(e).__name__}: {e}"})
        return 1
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            cmd = json.loads(line)
            op = cmd.get("op")
            if op == "device":
                _reply({"device": "cuda" if side.torch.cuda.is_available() else "cpu"})
            elif op == "build":
                _reply(side.build(cmd))
            elif op == "load":
                _reply(side.load(cmd))
            elif op == "time":
                _reply({"us": side.time(int(cmd["call"]), int(cmd.get("reps", 1)), int(cmd.get("tries", 1)))})
            else:
                _reply({"error": f"unknown op {op!r}"})
                return 1
        except Exception as e:
            traceback.print_exc()  # stderr: the orchestrator shows its tail
            _reply({"error": f"{type(e).__name__}: {str(e)[:300]}"})
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
