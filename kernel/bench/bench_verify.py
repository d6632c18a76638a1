"""Benchmark: the kdtree verify kernel vs SGLang 0.5.23's Triton extend_attention_fwd (and verify_shared_kv_fwd
on chain masks) on identical SGLang-shaped inputs, with the two roofline ceilings measured in the same run; then
the fp8 KV pool (SGLang --kv-cache-dtype fp8_e4m3) against the bf16 pool on the same shapes and against SGLang's
own fp8 Triton path (``fp8_cases``), and the sm_120 projection of every case (project_sm120.py).

    python kernel/bench/bench_verify.py --sglang-site /tmp/site --out kernel/bench/results/h200/results.json

Timing: every path is captured in a CUDA graph of several calls (as SGLang replays verify) and timed with
triton.testing.do_bench (median). Calls rotate over several input sets so small problems are not served from
L2. Writes the JSON (schema in docs/architecture.md) and a markdown table beside it.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import triton
from gpu_tag import results_dir
from kdtree_kernel import workspace_size
from kdtree_kernel.plan import HEAD_DIM, VALUE_DIM
from kdtree_kernel.testing import VerifyCase, make_case, rel_error
from mma_probe import load_mma_probe

SM_SCALE = 0.14468
FLOP_PER_KEY_ROW = 2 * HEAD_DIM + 2 * VALUE_DIM  # QK + PV per (query row, key)
ROTATION_BYTES = 256 * 2**20  # input sets per timing span at least this many bytes (> 4x the 60 MB L2)
CALLS_PER_GRAPH = 20
REP_MS = 100  # do_bench measuring window per timing (ms)

# the baseline grid of docs/sglang-verify.md, the baseline tool's extra cases, bs 128 x 4096, and q_len 32/64 cases.
TREE_CASES = [
    (1, 1024, 9, 8),
    (1, 8192, 9, 8),
    (1, 32768, 9, 8),
    (8, 8192, 9, 8),
    (32, 4096, 9, 8),
    (64, 8192, 9, 8),
    (128, 4096, 9, 8),
    (32, 32768, 16, 8),
    (8, 8192, 32, 8),
    (32, 4096, 32, 8),
    (8, 8192, 64, 16),
    (1, 8192, 64, 8),
    (32, 4096, 64, 8),
]
# FP8 vs bf16 on the same shapes: bs = 1 with q_len 9 (the K2.6 verify case, up to 128k), memory-bound cases
# (<= 32 rows per request, >= 128k KV tokens), and two of the grid's large cases.
FP8_CASES = [
    (1, 4096, 9, 8),
    (1, 32768, 9, 8),
    (1, 131072, 9, 8),
    (1, 131072, 2, 8),
    (1, 131072, 4, 8),
    (64, 8192, 2, 8),
    (16, 16384, 4, 8),
    (64, 8192, 9, 8),
    (32, 4096, 32, 8),
]
FP8_SCALE = 1 / 32  # values up to ~200 of e4m3's 448 (testing.make_case)
CHAIN_CASES = [
    (1, 1024, 9, 8),
    (1, 8192, 9, 8),
    (1, 32768, 9, 8),
    (8, 8192, 9, 8),
    (32, 4096, 9, 8),
    (64, 8192, 9, 8),
    (128, 4096, 9, 8),
]


@dataclass
class Ceilings:
    copy_gbps: float
    mma_tflops: float
    cublas_tflops: float


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def median_ms(fn: Callable[[], object]) -> float:
    return float(triton.testing.do_bench(fn, warmup=20, rep=REP_MS, return_mode="median"))


def measure_ceilings() -> Ceilings:
    src = torch.empty(2 * 2**30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    copy_ms = median_ms(functools.partial(dst.copy_, src))
    copy_gbps = 2 * src.numel() / copy_ms / 1e6
    del src, dst
    probe = load_mma_probe()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    sink = torch.zeros(sms * 8, dtype=torch.float32, device="cuda")
    best = 0.0
    for warps, blocks_per_sm in ((4, 4), (8, 2), (8, 4), (16, 2)):
        blocks = sms * blocks_per_sm
        flops = probe.run(sink, blocks, warps, 4096)
        ms = median_ms(lambda b=blocks, w=warps: probe.run(sink, b, w, 4096))
        best = max(best, flops / ms / 1e9)
    a = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    mm_ms = median_ms(lambda: a @ b)
    return Ceilings(copy_gbps, best, 2 * 8192**3 / mm_ms / 1e9)


def case_bytes(c: VerifyCase) -> int:
    """Fewest bytes a verify must move: every key row once (1 byte a dim for an fp8 pool), q once, the output
    once."""
    t = c.bs * c.q_len
    return c.kv_tokens * HEAD_DIM * c.kv_buffer.element_size() + t * c.heads * (HEAD_DIM + VALUE_DIM) * 2


def case_flops(c: VerifyCase) -> float:
    return float(sum(c.q_len * c.heads * (p + c.q_len) * FLOP_PER_KEY_ROW for p in c.prefix_lens))


def capture_graph(calls: list[Callable[[], object]]) -> tuple[torch.cuda.CUDAGraph, int]:
    """A CUDA graph of ``calls`` round-robin (at least CALLS_PER_GRAPH, each at least once), after a warm-up on a
    side stream; returns it with the number of calls it holds."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for fn in calls:
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    n = max(CALLS_PER_GRAPH, len(calls))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(n):
            calls[i % len(calls)]()
    return graph, n


def graph_time_us(calls: list[Callable[[], object]]) -> float:
    """Median time per call of a CUDA graph replaying ``calls`` round-robin (capture_graph)."""
    graph, n = capture_graph(calls)
    return median_ms(graph.replay) * 1e3 / n


def eager_time_us(calls: list[Callable[[], object]]) -> float:
    state = {"i": 0}

    def step() -> None:
        calls[state["i"] % len(calls)]()
        state["i"] += 1

    return median_ms(step) * 1e3


class CaseRunner:
    """One benchmark case: input sets, our op and SGLang's kernels bound to preallocated outputs."""

    def __init__(
        self,
        bs: int,
        prefix: int,
        q_len: int,
        heads: int,
        kind: str,
        seed: int,
        kv_dtype: torch.dtype = torch.bfloat16,
    ) -> None:
        fp8 = kv_dtype == torch.float8_e4m3fn
        one = (bs * (prefix + q_len) + 64) * HEAD_DIM * (1 if fp8 else 2)
        n_sets = max(1, min(32, math.ceil(ROTATION_BYTES / one)))
        scale = FP8_SCALE if fp8 else 1.0
        self.cases = [
            make_case(bs, prefix, q_len, heads, kind=kind, seed=seed + i, kv_dtype=kv_dtype, kv_scale=scale)  # type: ignore[arg-type]
            for i in range(n_sets)
        ]
        c = self.cases[0]
        t = bs * q_len
        self.out = torch.empty(t, heads, VALUE_DIM, dtype=torch.bfloat16, device="cuda")
        self.tri_out = torch.empty_like(self.out)
        self.skv_out = torch.empty_like(self.out)
        ws_bytes = workspace_size(bs, q_len, heads, prefix, fp8=fp8)
        self.ws = torch.empty(max(1, ws_bytes), dtype=torch.uint8, device="cuda")
        # The drafts' K as SGLang hands them to Triton: bf16 (for an fp8 pool, its dequantized rows).
        self.ext = [(x, self.draft_k(x)) for x in self.cases]
        self.c = c

    @staticmethod
    def draft_k(x: VerifyCase) -> torch.Tensor:
        rows = x.kv_buffer[x.draft_loc]
        if x.fp8:
            return (rows.float() * x.kv_scale).to(torch.bfloat16).contiguous()
        return rows.contiguous()

    def ours(self, x: VerifyCase) -> Callable[[], object]:
        return lambda: x.run_kernel(SM_SCALE, out=self.out, workspace=self.ws)

    def triton_extend(self, extend, x: VerifyCase, k_ext: torch.Tensor) -> Callable[[], object]:
        v_ext = k_ext[..., :VALUE_DIM]
        return lambda: extend.extend_attention_fwd(
            x.q,
            k_ext,
            v_ext,
            self.tri_out,
            x.kv_buffer,
            x.kv_buffer[..., :VALUE_DIM],
            x.qo_indptr,
            x.sgl_kv_indptr,
            x.sgl_kv_indices,
            x.custom_mask,
            True,
            x.mask_indptr,
            x.q_len,
            x.kv_scale,  # k_scale, v_scale: SGLang's descales of an fp8 pool (1 for bf16)
            x.kv_scale,
            sm_scale=SM_SCALE,
            skip_prefix_custom_mask=True,
        )

    def shared_kv(self, verify, x: VerifyCase, k_ext: torch.Tensor) -> Callable[[], object]:
        v_ext = k_ext[..., :VALUE_DIM].contiguous()
        return lambda: verify.verify_shared_kv_fwd(
            x.q,
            k_ext,
            v_ext,
            self.skv_out,
            x.kv_buffer,
            x.kv_buffer[..., :VALUE_DIM],
            x.qo_indptr,
            x.sgl_kv_indptr,
            x.sgl_kv_indices,
            None,
            True,
            x.mask_indptr,
            x.q_len,
            1.0,
            1.0,
            sm_scale=SM_SCALE,
            max_bs=x.bs,
        )


def timed(calls: list[Callable[[], object]]) -> float:
    try:
        return graph_time_us(calls)
    except Exception as exc:  # a path that cannot be captured is timed eagerly (noted in the log)
        log(f"  graph capture failed ({type(exc).__name__}: {str(exc)[:120]}); timing eagerly")
        torch.cuda.synchronize()
        return eager_time_us(calls)


def run_case(
    extend,
    verify,
    ceil: Ceilings,
    bs: int,
    prefix: int,
    q_len: int,
    heads: int,
    kind: str,
    seed: int,
) -> dict:
    r = CaseRunner(bs, prefix, q_len, heads, kind, seed)
    c = r.c
    r.ours(c)()
    r.triton_extend(extend, c, r.ext[0][1])()
    torch.cuda.synchronize()
    ref = c.reference(SM_SCALE)
    err = rel_error(r.out, ref)
    tri_err = rel_error(r.tri_out, ref)
    del ref
    kernel_us = timed([r.ours(x) for x in r.cases])
    triton_us = timed([r.triton_extend(extend, x, k) for x, k in r.ext])
    shared_us = None
    if kind == "chain" and verify is not None:
        r.ours(c)()  # our output for input set 0 again (the timing loops rotated over the sets)
        ran = r.shared_kv(verify, c, r.ext[0][1])()
        torch.cuda.synchronize()
        if ran:
            log(f"  shared_kv vs ours rel {rel_error(r.skv_out, r.out):.2e}")
            shared_us = timed([r.shared_kv(verify, x, k) for x, k in r.ext])
    floor_us = max(case_bytes(c) / ceil.copy_gbps / 1e3, case_flops(c) / ceil.mma_tflops / 1e6)
    rec = {
        "mask": kind,
        "bs": bs,
        "prefix": prefix,
        "q_len": q_len,
        "H": heads,
        "kernel_us": round(kernel_us, 2),
        "triton_us": round(triton_us, 1),
        "speedup": round(triton_us / kernel_us, 1),
        "shared_kv_us": None if shared_us is None else round(shared_us, 1),
        "roofline_frac": round(floor_us / kernel_us, 3),
        "rel_err": float(f"{err:.3e}"),
    }
    extra = {
        "GBps": round(case_bytes(c) / kernel_us / 1e3),
        "TFLOPs": round(case_flops(c) / kernel_us / 1e6, 1),
        "floor_us": round(floor_us, 2),
        "kv_tokens": c.kv_tokens,
        "triton_rel_err": float(f"{tri_err:.3e}"),
        "sets": len(r.cases),
    }
    return {"rec": rec, "extra": extra}


def run_fp8_case(extend, ceil: Ceilings, bs: int, prefix: int, q_len: int, heads: int, seed: int) -> dict:
    """The fp8 pool vs the bf16 pool (same shapes, timed alike) and vs SGLang's own fp8 Triton path."""
    r16 = CaseRunner(bs, prefix, q_len, heads, "tree", seed)
    bf16_us = timed([r16.ours(x) for x in r16.cases])
    floor16 = max(case_bytes(r16.c) / ceil.copy_gbps / 1e3, case_flops(r16.c) / ceil.mma_tflops / 1e6)
    del r16
    torch.cuda.empty_cache()
    r = CaseRunner(bs, prefix, q_len, heads, "tree", seed, kv_dtype=torch.float8_e4m3fn)
    c = r.c
    r.ours(c)()
    r.triton_extend(extend, c, r.ext[0][1])()
    torch.cuda.synchronize()
    ref = c.reference(SM_SCALE)
    err = rel_error(r.out, ref)
    tri_err = rel_error(r.tri_out, ref)
    ours_vs_triton = rel_error(r.out, r.tri_out)
    del ref
    kernel_us = timed([r.ours(x) for x in r.cases])
    triton_us = timed([r.triton_extend(extend, x, k) for x, k in r.ext])
    floor_us = max(case_bytes(c) / ceil.copy_gbps / 1e3, case_flops(c) / ceil.mma_tflops / 1e6)
    return {
        "mask": "tree",
        "bs": bs,
        "prefix": prefix,
        "q_len": q_len,
        "H": heads,
        "kernel_us": round(kernel_us, 2),
        "bf16_us": round(bf16_us, 2),
        "fp8_speedup": round(bf16_us / kernel_us, 2),
        "triton_us": round(triton_us, 1),
        "speedup": round(triton_us / kernel_us, 1),
        "roofline_frac": round(floor_us / kernel_us, 3),
        "bf16_roofline_frac": round(floor16 / bf16_us, 3),
        "rel_err": float(f"{err:.3e}"),
        "triton_rel_err": float(f"{tri_err:.3e}"),
        "rel_vs_triton": float(f"{ours_vs_triton:.3e}"),
        "kv_tokens": c.kv_tokens,
        "GBps": round(case_bytes(c) / kernel_us / 1e3),
    }


def geomean(xs: list[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def fp8_markdown(cases: list[dict]) -> list[str]:
    lines = [
        "## FP8 KV pool (SGLang --kv-cache-dtype fp8_e4m3) vs bf16, same shapes",
        "",
        "fp8 us: the kernel on a float8_e4m3fn pool (scale 1/32; the e4m3 tensor-core kernel in 16-row blocks, "
        "verify_attention_fp8mma.cuh, in its fp16-mma form on sm_90); bf16 us: the same shapes on a bf16 pool; "
        "Triton fp8: SGLang's extend_attention_fwd on the same fp8 pool (it rounds Q and P to e4m3 for the prefix). "
        "rel err: against the fp32 reference on the dequantized pool. Roofline: fp8 bytes (576 per key).",
        "",
        "| bs | prefix | q_len | H | KV tokens | fp8 us | bf16 us | fp8 speedup | fp8 roofline | bf16 roofline "
        "| GB/s | Triton fp8 us | vs Triton fp8 | rel err | Triton fp8 rel err | ours vs Triton fp8 |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in cases:
        lines.append(
            f"| {c['bs']} | {c['prefix']} | {c['q_len']} | {c['H']} | {c['kv_tokens']} | {c['kernel_us']:.1f} | "
            f"{c['bf16_us']:.1f} | {c['fp8_speedup']:.2f}x | {c['roofline_frac']:.0%} | "
            f"{c['bf16_roofline_frac']:.0%} | {c['GBps']} | {c['triton_us']:.0f} | {c['speedup']:.1f}x | "
            f"{c['rel_err']:.1e} | {c['triton_rel_err']:.1e} | {c['rel_vs_triton']:.1e} |"
        )
    return lines


def write_markdown(path: Path, result: dict, extras: list[dict], cublas: float) -> None:
    from project_sm120 import HEADER, is_projectable, markdown, project_all

    cases = result["cases"]
    tree = [c["speedup"] for c in cases]
    lines = [
        f"# kdtree verify kernel vs SGLang 0.5.23 Triton on {result['device']}",
        "",
        f"Ceilings measured in this run: copy {result['copy_GBps']:.0f} GB/s, mma.sync bf16 "
        f"{result['mma_TFLOPs']:.0f} TFLOP/s (cuBLAS bf16 {cublas:.0f} TFLOP/s, wgmma, for reference).",
        (
            f"Geometric-mean speedup over extend_attention_fwd: {geomean(tree):.1f}x (min {min(tree):.1f}x) over "
            f"{len(tree)} cases. Times are medians of CUDA-graph replays, inputs rotated past L2."
            if tree
            else "No bf16 cases in this run (--fp8 only). Times are medians of CUDA-graph replays, inputs rotated past L2."
        ),
        "",
        "| mask | bs | prefix | q_len | H | kernel us | Triton us | speedup | shared_kv us | vs shared_kv "
        "| GB/s | TFLOP/s | floor us | roofline | rel err |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c, e in zip(cases, extras, strict=True):
        skv = "" if c["shared_kv_us"] is None else f"{c['shared_kv_us']:.1f}"
        vs = "" if c["shared_kv_us"] is None else f"{c['shared_kv_us'] / c['kernel_us']:.1f}x"
        lines.append(
            f"| {c['mask']} | {c['bs']} | {c['prefix']} | {c['q_len']} | {c['H']} | {c['kernel_us']:.1f} | "
            f"{c['triton_us']:.0f} | {c['speedup']:.1f}x | {skv} | {vs} | {e['GBps']} | {e['TFLOPs']} | "
            f"{e['floor_us']:.1f} | {c['roofline_frac']:.0%} | {c['rel_err']:.1e} |"
        )
    if result.get("fp8_cases"):
        lines += ["", *fp8_markdown(result["fp8_cases"])]
    if is_projectable(result):
        lines += ["", *HEADER, *markdown(project_all(result))]
    else:  # measured on the GPU the projection is about, or another one: no projection from it
        lines += [
            "",
            f"Measured on {result['device']} (compute capability {result['compute_capability']}): no sm_120 "
            "projection from this run. The H200 run's prediction for each case is in sm120-projection.md.",
        ]
    path.write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sglang-site", default="/tmp/site", help="dir with the sglang wheel unpacked")
    parser.add_argument("--out", type=Path, default=results_dir() / "results.json")
    parser.add_argument("--quick", action="store_true", help="first three tree cases only")
    parser.add_argument("--fp8", choices=("with", "only", "none"), default="with", help="the fp8 section")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from sglang_triton import load_sglang_attention

    extend, verify = load_sglang_attention(args.sglang_site)
    started = time.time()
    ceil = measure_ceilings()
    log(
        f"ceilings: copy {ceil.copy_gbps:.0f} GB/s, mma.sync {ceil.mma_tflops:.0f} TF/s, cuBLAS {ceil.cublas_tflops:.0f} TF/s"
    )
    plan = [("tree", *c) for c in TREE_CASES] + [("chain", *c) for c in CHAIN_CASES]
    if args.quick:
        plan = plan[:3]
    if args.fp8 == "only":
        plan = []
    cases, extras = [], []
    for i, (kind, bs, prefix, q_len, heads) in enumerate(plan):
        got = run_case(extend, verify, ceil, bs, prefix, q_len, heads, kind, seed=1000 * i)
        cases.append(got["rec"])
        extras.append(got["extra"])
        log(json.dumps({**got["rec"], **got["extra"]}))
        torch.cuda.empty_cache()
    fp8_cases = []
    for i, (bs, prefix, q_len, heads) in enumerate(FP8_CASES if args.fp8 != "none" else []):
        got = run_fp8_case(extend, ceil, bs, prefix, q_len, heads, seed=500_000 + 1000 * i)
        fp8_cases.append(got)
        log(json.dumps({"fp8": True, **got}))
        torch.cuda.empty_cache()
    result = {
        "device": torch.cuda.get_device_name(),
        "compute_capability": "{}.{}".format(*torch.cuda.get_device_capability()),
        "copy_GBps": round(ceil.copy_gbps),
        "mma_TFLOPs": round(ceil.mma_tflops, 1),
        "cases": cases,
        "fp8_cases": fp8_cases,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    write_markdown(args.out.with_suffix(".md"), result, extras, ceil.cublas_tflops)
    args.out.with_suffix(".extra.json").write_text(
        json.dumps({"cublas_TFLOPs": round(ceil.cublas_tflops, 1), "cases": extras}, indent=1) + "\n"
    )
    log(f"done in {time.time() - started:.0f} s")
    print(args.out.with_suffix(".md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
