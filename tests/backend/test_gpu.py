"""GPU: the backend's verify path (marshal -> CUDA kernel) against SGLang's Triton ``extend_attention_fwd`` on
SGLang-shaped batches, CUDA-graph capture/replay of the engine with parity inside the graph, and the replay
service on the GPU. SGLang's Triton kernels come from an unpacked sglang wheel ($SGLANG_SITE, default
/tmp/site) loaded without SGLang's package __init__ (kernel/bench/sglang_triton.py)."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
from pathlib import Path
from types import ModuleType

import pytest
import torch
from kdtree_backend.batch import dense_verify_attention, make_verify_batch
from kdtree_backend.config import ParityConfig
from kdtree_backend.engine import VerifyEngine
from kdtree_backend.verify import attend, marshal_verify, parity_stats

from tests.backend.emulation import target_verify_extend
from tests.backend.helpers import PARITY_RE, PYTHON, REPO, buggy_release, replay_env
from tests.gpu_helpers import NEEDS_CUDA, require_kernel

pytestmark = list(NEEDS_CUDA)
SITE = Path(os.environ.get("SGLANG_SITE", "/tmp/site"))
GRAPH_PARITY = re.compile(r"^\[kdtree\] L(\d+) max_abs_diff=\S+ mean=\S+ rel=(\S+) tp=0 mode=graph step=(\d+)$")


def sglang_extend() -> ModuleType:
    loader_path = REPO / "kernel" / "bench" / "sglang_triton.py"
    if not loader_path.is_file():
        pytest.skip("kernel/bench/sglang_triton.py (SGLang Triton loader) is missing")
    if not (SITE / "sglang").is_dir():
        pytest.skip(f"no sglang wheel unpacked at {SITE} (pip install --no-deps --target {SITE} sglang==0.5.23)")
    spec = importlib.util.spec_from_file_location("kdtree_sglang_triton", loader_path)
    assert spec is not None and spec.loader is not None
    loader = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loader)
    extend, _ = loader.load_sglang_attention(SITE)
    return extend


CASES = [
    (1, 21, 9, 8, "tree"),
    (4, 1000, 9, 8, "tree"),
    (3, 500, 16, 8, "star"),
    (8, 300, 64, 16, "chain"),
    (2, 2000, 128, 8, "tree"),
    (16, 4096, 9, 8, "tree"),
]


@pytest.mark.parametrize(("bs", "prefix", "q_len", "heads", "kind"), CASES)
def test_verify_path_matches_sglang_triton(bs: int, prefix: int, q_len: int, heads: int, kind: str) -> None:
    require_kernel()
    extend = sglang_extend()
    batch = make_verify_batch(bs=bs, prefix=prefix, q_len=q_len, heads=heads, tree=kind, device="cuda", seed=bs)
    meta = marshal_verify(
        batch.kv_indptr, batch.kv_indices, batch.out_cache_loc, batch.custom_mask, batch.mask_indptr, q_len
    )
    out = attend(batch.q[0], batch.kv_buffers[0], meta, batch.qo_indptr, batch.sm_scale, use_kernel=True)
    ref = torch.empty_like(out)
    target_verify_extend(extend.extend_attention_fwd, batch, 0, ref, batch.qo_indptr)
    torch.cuda.synchronize()
    rel_triton = parity_stats(out, ref)[2]
    rel_dense = parity_stats(out, dense_verify_attention(batch, 0))[2]
    print(
        f"case bs={bs} prefix={prefix} q_len={q_len} H={heads} {kind}: rel_vs_triton={rel_triton:.3e} "
        f"rel_vs_dense={rel_dense:.3e}"
    )
    assert rel_triton <= 1e-2 and rel_dense <= 1e-2


FP8_SCALE = 1 / 16  # a calibrated per-layer scale: the batch's values (|x| < ~30) sit well inside e4m3's 448


@pytest.mark.parametrize(("bs", "prefix", "q_len", "heads", "kind"), CASES[:4])
def test_fp8_pool_served_by_the_kernel_against_sglang_fp8_triton(
    bs: int, prefix: int, q_len: int, heads: int, kind: str
) -> None:
    """SGLang --kv-cache-dtype fp8_e4m3: the pool holds k / k_scale in e4m3 and Triton gets k_scale, v_scale.
    The kernel reads that pool through the backend's verify path; against the fp32 attention on the dequantized
    pool it meets 1e-2, and the parity figure (vs SGLang's own fp8 Triton path, which rounds Q and P to e4m3 for
    the prefix) is printed and bounded by the gate's fail threshold (5e-2)."""
    require_kernel()
    extend = sglang_extend()
    batch = make_verify_batch(bs=bs, prefix=prefix, q_len=q_len, heads=heads, tree=kind, device="cuda", seed=bs)
    pool8 = (batch.kv_buffers[0].float() / FP8_SCALE).to(torch.float8_e4m3fn)
    batch.kv_buffers[0] = (pool8.float() * FP8_SCALE).to(torch.bfloat16)  # what the dense check sees
    meta = marshal_verify(
        batch.kv_indptr, batch.kv_indices, batch.out_cache_loc, batch.custom_mask, batch.mask_indptr, q_len
    )
    out = attend(
        batch.q[0], pool8, meta, batch.qo_indptr, batch.sm_scale, use_kernel=True, k_scale=FP8_SCALE, v_scale=FP8_SCALE
    )
    ref = torch.empty_like(out)
    target_verify_extend(extend.extend_attention_fwd, batch, 0, ref, batch.qo_indptr, pool=pool8, kv_scale=FP8_SCALE)
    torch.cuda.synchronize()
    dense = dense_verify_attention(batch, 0)
    rel_triton = parity_stats(out, ref)[2]
    rel_dense = parity_stats(out, dense)[2]
    triton_dense = parity_stats(ref, dense)[2]
    print(
        f"fp8 case bs={bs} prefix={prefix} q_len={q_len} H={heads} {kind}: rel_vs_sglang_fp8_triton={rel_triton:.3e} "
        f"rel_vs_dense={rel_dense:.3e} sglang_fp8_triton_vs_dense={triton_dense:.3e}"
    )
    assert rel_dense <= 1e-2
    assert rel_triton < 5e-2


def test_cuda_graph_capture_and_replay_with_parity_lines() -> None:
    require_kernel()
    extend = sglang_extend()
    import kdtree_kernel

    bs, prefix, q_len, heads, layers = 4, 700, 9, 8, (0, 30)
    lines: list[str] = []
    engine = VerifyEngine(
        q_len=q_len, heads=heads, parity=ParityConfig(True, 2, (30,), 0), use_kernel=True, sink=lines.append
    )
    max_context = prefix + q_len
    engine.allocate_graph_buffers(
        max_bs=bs,
        max_context_len=max_context,
        device=torch.device("cuda"),
        workspace_bytes=kdtree_kernel.workspace_size(bs, q_len, heads, max_context),
    )
    # Static inputs, as SGLang's graph runner keeps them; each step copies a fresh batch in.
    first = make_verify_batch(bs=bs, prefix=prefix, q_len=q_len, heads=heads, layers=layers, device="cuda", seed=0)
    static = make_verify_batch(bs=bs, prefix=prefix, q_len=q_len, heads=heads, layers=layers, device="cuda", seed=0)
    kv_indices = torch.zeros(bs * max_context, dtype=torch.long, device="cuda")
    custom_mask = torch.zeros(bs * q_len * (max_context + q_len), dtype=torch.uint8, device="cuda")
    outs = {layer: torch.empty(bs * q_len, heads, 512, dtype=torch.bfloat16, device="cuda") for layer in layers}
    k_ext = {layer: torch.empty(bs * q_len, 1, 576, dtype=torch.bfloat16, device="cuda") for layer in layers}

    def load(batch) -> None:
        static.kv_indptr.copy_(batch.kv_indptr)
        kv_indices[: batch.kv_indices.numel()].copy_(batch.kv_indices)
        custom_mask[: batch.custom_mask.numel()].copy_(batch.custom_mask)
        static.mask_indptr.copy_(batch.mask_indptr)
        static.out_cache_loc.copy_(batch.out_cache_loc)
        for layer in layers:
            static.q[layer].copy_(batch.q[layer])
            static.kv_buffers[layer].copy_(batch.kv_buffers[layer])
            k_ext[layer].copy_(batch.k_extend(layer))

    def prepare(capture: bool) -> None:
        engine.prepare(
            kv_indptr=static.kv_indptr,
            kv_indices=kv_indices,
            out_cache_loc=static.out_cache_loc,
            custom_mask=custom_mask,
            mask_indptr=static.mask_indptr,
            qo_indptr=static.qo_indptr.long(),
            bs=bs,
            graph=True,
            capture=capture,
            kv_buffer_shape=static.kv_buffers[0].shape,
        )

    def forward() -> None:
        for layer in layers:

            def reference(out: torch.Tensor, rail: torch.Tensor, layer: int = layer) -> None:
                kv = static.kv_buffers[layer]
                extend.extend_attention_fwd(
                    static.q[layer],
                    k_ext[layer],
                    k_ext[layer][..., :512].contiguous(),
                    out,
                    kv,
                    kv[..., :512],
                    rail,
                    static.kv_indptr,
                    kv_indices,
                    custom_mask,
                    True,
                    static.mask_indptr,
                    q_len,
                    1.0,
                    1.0,
                    sm_scale=static.sm_scale,
                )

            engine.forward(layer, static.q[layer], static.kv_buffers[layer], outs[layer], static.sm_scale, reference)

    load(first)
    prepare(capture=True)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        forward()  # warm-up (Triton JIT) outside the capture, as SGLang does
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        forward()
    rels = []
    for index in range(6):
        batch = make_verify_batch(
            bs=bs, prefix=prefix, q_len=q_len, heads=heads, layers=layers, device="cuda", seed=100 + index
        )
        load(batch)
        prepare(capture=False)
        graph.replay()
        for layer in layers:
            rels.append(parity_stats(outs[layer], dense_verify_attention(batch, layer))[2])
    engine.flush()
    print("graph replay rel vs dense:", [f"{r:.2e}" for r in rels])
    print("\n".join(lines))
    assert max(rels) <= 1e-2
    graph_lines = [m for m in map(GRAPH_PARITY.match, lines) if m]
    assert [int(m.group(3)) for m in graph_lines] == [0, 2, 4]
    assert all(int(m.group(1)) == 30 and float(m.group(2)) <= 1e-2 for m in graph_lines)


def _run_replay(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = replay_env(root)
    if "KDTREE_EXT_DIR" in os.environ:
        env["KDTREE_EXT_DIR"] = os.environ["KDTREE_EXT_DIR"]
    else:
        env["KDTREE_EXT_DIR"] = str(REPO / "kernel" / "build")
    return subprocess.run(
        [PYTHON, "-m", "kdtree_backend.replay", *args],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_replay_service_green_on_gpu() -> None:
    require_kernel()
    res = _run_replay(
        REPO,
        "--steps",
        "3",
        "--device",
        "cuda",
        "--interval",
        "0",
        "--bs",
        "8",
        "--prefix",
        "4096",
        "--threshold",
        "0.02",
    )
    print(res.stdout)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "path=kernel" in res.stdout
    rels = [float(m.group(4)) for m in map(PARITY_RE.match, res.stdout.splitlines()) if m]
    assert len(rels) == 9 and max(rels) <= 0.02


def test_replay_classic_bug_caught_on_gpu(tmp_path: Path) -> None:
    require_kernel()
    root = buggy_release("drafts", tmp_path)
    res = _run_replay(root, "--steps", "1", "--device", "cuda", "--interval", "0", "--threshold", "0.02")
    print(res.stdout)
    assert res.returncode == 3, res.stdout + res.stderr


def test_launcher_extension_preflight_passes_on_this_gpu() -> None:
    require_kernel()
    from kdtree_backend.launch import check_extension

    check_extension()  # raises PreflightError with the reason when the build does not fit this host
