"""The benchmark cases projected onto the production GPU (RTX PRO 6000 Blackwell, sm_120) from counted work.

    python kernel/bench/project_sm120.py   # results/h200/results.json -> sm120-projection.{json,md} beside it

No GPU and no torch: for each case of the committed H200 run (bf16, and fp8 where the run has fp8 cases) this
counts, from the kernel's structure (csrc/verify_attention_kernel.cuh) and its launch plan (kdtree_kernel.plan,
planned for each GPU's SM count):
  * DRAM bytes: every key row once, q, the output, and the split-KV partials (written by the main kernel, read
    by the combine); and the bytes the blocks request from L2, every key row once per row block of its request
    (a 72-row request runs as two 48-row blocks that read its keys at the same time, the second mostly from
    L2);
  * flops on real rows (q_len x H x keys x 2176) and padded to the mma's 16-row tiles of each row block;
  * shared-memory bytes per 16-key step of a block (K ldmatrix of the score warps, the gathers, V and P
    ldmatrix of the value warps, the pair exchange; the fp8 path adds its raw tile and the widening pass).
Each is turned into a time on each GPU (bytes / bandwidth, padded flops / mma rate, shared bytes / (SMs x
128 B/clk x clock)); the largest is the case's floor and binding limit there. ``est_us`` scales the measured
H200 time by the ratio of the two GPUs' floors: the same efficiency against the binding limit, which is an
assumption, not a measurement (the sm_120 card was never run here).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from types import ModuleType

from gpu_tag import results_dir

HERE = Path(__file__).resolve().parent
HEAD_DIM = 576
VALUE_DIM = 512
BLOCK_N = 16  # keys per pipeline step (kBlockN)
FLOP_PER_KEY_ROW = 2 * HEAD_DIM + 2 * VALUE_DIM


@dataclass(frozen=True)
class Gpu:
    name: str
    sms: int
    clock_ghz: float
    dram_gbps: float
    mma_tflops: float  # mma.sync bf16 / fp16 dense, fp32 accumulate
    smem_bytes_per_clk: int = 128  # per SM


# Published figures of the production card (the issue's): 188 SMs, ~2.6 GHz boost, 1.79 TB/s, ~504 TFLOP/s.
RTX_PRO_6000 = Gpu("RTX PRO 6000 (sm_120)", 188, 2.6, 1790.0, 504.0)


def h200(result: dict) -> Gpu:
    """The H200 with the ceilings measured in the run itself (copy bandwidth, mma.sync rate); its SM clock
    under this load sat at 1.76-1.97 GHz (results/h200/steps.md): 1.9 is used."""
    return Gpu("H200 (sm_90)", 132, 1.9, float(result["copy_GBps"]), float(result["mma_TFLOPs"]))


def _plan_module() -> ModuleType:
    """kdtree_kernel.plan without the package __init__ (which imports torch)."""
    path = HERE.parent / "kdtree_kernel" / "plan.py"
    spec = importlib.util.spec_from_file_location("kdtree_plan", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


PLAN = _plan_module()


@dataclass(frozen=True)
class Work:
    dram_bytes: float
    l2_bytes: float  # keys once per row block
    flops_real: float
    flops_padded: float
    smem_bytes_per_step: int  # one block, one 16-key step
    smem_bytes: float  # all blocks, all steps
    blocks: int
    steps_per_block: int


def smem_bytes_per_step(row_groups: int, fp8: bool) -> int:
    """Shared-memory traffic of one 16-key step of a block (bytes read + written), counted from the kernel."""
    k_ldmatrix = 2 * row_groups * BLOCK_N * (HEAD_DIM // 2) * 2  # each score warp: its half of the dims
    v_ldmatrix = 8 * BLOCK_N * (VALUE_DIM // 8) * 2  # 8 value warps, 64 columns each
    p_store = row_groups * 16 * BLOCK_N * 2
    p_ldmatrix = 8 * row_groups * 16 * BLOCK_N * 2  # every value warp reads all rows' P
    exchange = 2 * row_groups * 2 * 32 * 32  # each score warp writes and reads 32 lanes x 2 float4
    gather = BLOCK_N * HEAD_DIM * 2  # cp.async into the 16-bit stage
    if fp8:  # raw e4m3 tile written, read back, widened into the 16-bit stage
        gather = BLOCK_N * HEAD_DIM + BLOCK_N * HEAD_DIM + BLOCK_N * HEAD_DIM * 2
    return k_ldmatrix + v_ldmatrix + p_store + p_ldmatrix + exchange + gather


def count_work(bs: int, prefix: int, q_len: int, heads: int, *, fp8: bool, gpu: Gpu) -> Work:
    # fp8: the counts below model the widening path's 48-row blocks, so its plan keeps them.
    plan = PLAN.plan_launch(bs, q_len, heads, prefix, num_sms=gpu.sms, blocks_per_sm=1, fixed_row_groups=fp8)
    keys = prefix + q_len
    rows = q_len * heads
    row_bytes = HEAD_DIM * (1 if fp8 else 2)
    io = bs * q_len * heads * (HEAD_DIM + VALUE_DIM) * 2
    if plan.splits > 1:
        io += 2 * bs * plan.splits * rows * PLAN.PARTIAL_ROW_BYTES  # bf16 partial rows + fp32 LSEs, out and back
    dram = bs * keys * row_bytes + io
    padded_rows = plan.row_blocks * plan.row_groups * 16
    steps = math.ceil(plan.chunk_keys / BLOCK_N)
    per_step = smem_bytes_per_step(plan.row_groups, fp8)
    blocks = plan.blocks
    return Work(
        dram_bytes=float(dram),
        l2_bytes=float(bs * keys * row_bytes * plan.row_blocks + io),
        flops_real=float(bs * rows * keys * FLOP_PER_KEY_ROW),
        flops_padded=float(bs * padded_rows * keys * FLOP_PER_KEY_ROW),
        smem_bytes_per_step=per_step,
        smem_bytes=float(blocks * steps * per_step),
        blocks=blocks,
        steps_per_block=steps,
    )


def floors_us(work: Work, gpu: Gpu) -> dict[str, float]:
    """Time each resource needs on ``gpu`` (us). Shared memory is per SM: blocks run in waves of one per SM."""
    waves = math.ceil(work.blocks / gpu.sms)
    smem_per_sm = waves * work.steps_per_block * work.smem_bytes_per_step
    return {
        "dram": work.dram_bytes / gpu.dram_gbps / 1e3,
        "mma": work.flops_padded / gpu.mma_tflops / 1e6,
        "smem": smem_per_sm / (gpu.smem_bytes_per_clk * gpu.clock_ghz * 1e3),
    }


@dataclass(frozen=True)
class Projection:
    kv: str
    mask: str
    bs: int
    prefix: int
    q_len: int
    H: int
    h200_us: float
    dram_MB: float
    l2_MB: float
    gflop_real: float
    gflop_padded: float
    smem_KB_per_step: float
    h200_floor_us: float
    h200_bound: str
    sm120_floor_us: float
    sm120_bound: str
    sm120_est_us: float
    sm120_floors: dict[str, float]


def project(case: dict, result: dict, *, fp8: bool = False) -> Projection:
    gpu_h = h200(result)
    args = (case["bs"], case["prefix"], case["q_len"], case["H"])
    work_h = count_work(*args, fp8=fp8, gpu=gpu_h)
    work_s = count_work(*args, fp8=fp8, gpu=RTX_PRO_6000)
    fh = floors_us(work_h, gpu_h)
    fs = floors_us(work_s, RTX_PRO_6000)
    bound_h = max(fh, key=lambda k: fh[k])
    bound_s = max(fs, key=lambda k: fs[k])
    return Projection(
        kv="fp8" if fp8 else "bf16",
        mask=case.get("mask", "tree"),
        bs=case["bs"],
        prefix=case["prefix"],
        q_len=case["q_len"],
        H=case["H"],
        h200_us=case["kernel_us"],
        dram_MB=round(work_s.dram_bytes / 1e6, 2),
        l2_MB=round(work_s.l2_bytes / 1e6, 2),
        gflop_real=round(work_s.flops_real / 1e9, 2),
        gflop_padded=round(work_s.flops_padded / 1e9, 2),
        smem_KB_per_step=round(work_s.smem_bytes_per_step / 1024, 1),
        h200_floor_us=round(fh[bound_h], 2),
        h200_bound=bound_h,
        sm120_floor_us=round(fs[bound_s], 2),
        sm120_bound=bound_s,
        sm120_est_us=round(case["kernel_us"] * fs[bound_s] / fh[bound_h], 1),
        sm120_floors={k: round(v, 2) for k, v in fs.items()},
    )


def is_projectable(result: dict) -> bool:
    """The projection scales an H200 run (its ceilings, 132 SMs at 1.9 GHz, h200()); a run on another GPU, the sm_120
    itself included, is measured, not projected. Files from before the field was recorded are H200 runs."""
    return result.get("compute_capability", "9.0") == "9.0"


def check_projectable(result: dict) -> None:
    if not is_projectable(result):
        raise ValueError(
            f"this run is on {result.get('device', 'an unnamed GPU')} (compute capability "
            f"{result['compute_capability']}), not an H200: the projection starts from an H200 run "
            "(results/h200/results.json)"
        )


def project_all(result: dict) -> list[Projection]:
    check_projectable(result)
    out = [project(c, result) for c in result["cases"]]
    out += [project(c, result, fp8=True) for c in result.get("fp8_cases", [])]
    return out


def markdown(projections: list[Projection]) -> list[str]:
    lines = [
        "| kv | mask | bs | prefix | q_len | H | H200 us | DRAM MB | GFLOP real / padded | smem KB/step "
        "| H200 floor us (bound) | sm_120 floor us (bound) | sm_120 est us |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for p in projections:
        lines.append(
            f"| {p.kv} | {p.mask} | {p.bs} | {p.prefix} | {p.q_len} | {p.H} | {p.h200_us:.1f} | {p.dram_MB:.1f} "
            f"| {p.gflop_real:.1f} / {p.gflop_padded:.1f} | {p.smem_KB_per_step:.0f} | {p.h200_floor_us:.1f} "
            f"({p.h200_bound}) | {p.sm120_floor_us:.1f} ({p.sm120_bound}) | {p.sm120_est_us:.1f} |"
        )
    return lines


HEADER = [
    "## Projection to the RTX PRO 6000 (sm_120)",
    "",
    f"From counted work (kernel/bench/project_sm120.py): {RTX_PRO_6000.sms} SMs, {RTX_PRO_6000.clock_ghz} GHz, "
    f"{RTX_PRO_6000.dram_gbps / 1e3:.2f} TB/s, {RTX_PRO_6000.mma_tflops:.0f} TFLOP/s mma (bf16 / fp16, fp32 "
    "accumulate), 128 B/clk shared memory per SM; the H200 with this run's ceilings at 1.9 GHz. Floors: DRAM "
    "bytes (each key once), padded flops, shared-memory bytes per step x steps per SM. "
    "est = H200 time x sm_120 floor / H200 floor (same efficiency against the binding limit: an assumption).",
    "",
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--results", type=Path, default=results_dir() / "results.json")
    parser.add_argument("--out", type=Path, default=results_dir() / "sm120-projection.json")
    args = parser.parse_args(argv)
    result = json.loads(args.results.read_text())
    try:
        projections = project_all(result)
    except ValueError as exc:
        print(f"project_sm120.py: {args.results}: {exc}", file=sys.stderr)
        return 2
    args.out.write_text(json.dumps([asdict(p) for p in projections], indent=1) + "\n")
    text = "\n".join(["# " + HEADER[0][3:], *HEADER[1:], *markdown(projections)]) + "\n"
    args.out.with_suffix(".md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
