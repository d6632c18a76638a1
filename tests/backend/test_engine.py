"""The verify engine on CPU (reference path): eager parity on sampled steps, and the graph-mode protocol
(preallocated buffers, parity rail armed only on sampled steps, lines printed from the deferred copy)."""

from __future__ import annotations

import re

import torch
from kdtree_backend.batch import dense_verify_attention, make_verify_batch
from kdtree_backend.config import ParityConfig
from kdtree_backend.engine import VerifyEngine
from kdtree_backend.verify import parity_stats

from tests.backend.emulation import extend_attention_emulated, target_verify_extend

PARITY = re.compile(r"^\[kdtree\] L(\d+) max_abs_diff=\S+ mean=\S+ rel=(\S+) tp=0 mode=(\w+) step=(\d+)$")
SHAPES = re.compile(r"^\[kdtree\] shapes .* kv_len_max=(\d+) ")


def reference_for(batch, layer: int):
    def run(out: torch.Tensor, qo_indptr: torch.Tensor) -> None:
        target_verify_extend(extend_attention_emulated, batch, layer, out, qo_indptr)

    return run


def step(engine: VerifyEngine, batch, *, graph: bool, capture: bool = False) -> dict[int, torch.Tensor]:
    engine.prepare(
        kv_indptr=batch.kv_indptr,
        kv_indices=batch.kv_indices,
        out_cache_loc=batch.out_cache_loc,
        custom_mask=batch.custom_mask,
        mask_indptr=batch.mask_indptr,
        qo_indptr=batch.qo_indptr.long(),
        bs=batch.bs,
        graph=graph,
        capture=capture,
        kv_buffer_shape=batch.kv_buffers[batch.layers[0]].shape,
    )
    outs = {}
    for layer in batch.layers:
        out = torch.empty(batch.tokens, batch.heads, 512, dtype=batch.q[layer].dtype)
        engine.forward(layer, batch.q[layer], batch.kv_buffers[layer], out, batch.sm_scale, reference_for(batch, layer))
        outs[layer] = out
    return outs


def test_eager_parity_on_sampled_steps_only() -> None:
    lines: list[str] = []
    engine = VerifyEngine(
        q_len=9, heads=4, parity=ParityConfig(True, 2, (0, 5), 0), use_kernel=False, sink=lines.append
    )
    for index in range(4):
        batch = make_verify_batch(bs=2, prefix=30, q_len=9, heads=4, layers=(0, 3, 5), seed=index)
        outs = step(engine, batch, graph=False)
        for layer, out in outs.items():
            assert parity_stats(out, dense_verify_attention(batch, layer))[2] < 1e-2
    parity = [PARITY.match(line) for line in lines if " L" in line]
    assert all(parity)
    assert [(int(m.group(1)), int(m.group(4)), m.group(3)) for m in parity if m] == [
        (0, 0, "eager"),
        (5, 0, "eager"),
        (0, 2, "eager"),
        (5, 2, "eager"),
    ]
    assert all(float(m.group(2)) < 1e-2 for m in parity if m)
    shapes = [SHAPES.match(line) for line in lines if "shapes" in line]
    assert len(shapes) == 1 and shapes[0] and int(shapes[0].group(1)) == 39


def test_eager_parity_on_every_step_of_the_burst_then_every_n() -> None:
    lines: list[str] = []
    parity = ParityConfig(True, 3, (0,), burst_steps=2)
    engine = VerifyEngine(q_len=9, heads=4, parity=parity, use_kernel=False, sink=lines.append)
    for index in range(7):
        step(engine, make_verify_batch(bs=1, prefix=20, q_len=9, heads=4, layers=(0,), seed=index), graph=False)
    steps = [int(m.group(4)) for m in map(PARITY.match, lines) if m]
    assert steps == [0, 1, 3, 6]


def test_graph_protocol_arms_parity_on_sampled_steps_and_reports_later() -> None:
    lines: list[str] = []
    engine = VerifyEngine(q_len=9, heads=4, parity=ParityConfig(True, 3, (0,), 0), use_kernel=False, sink=lines.append)
    engine.allocate_graph_buffers(max_bs=4, max_context_len=64, device=torch.device("cpu"), dtype=torch.bfloat16)
    assert engine.graph is not None
    capture_batch = make_verify_batch(bs=2, prefix=30, q_len=9, heads=4, layers=(0, 1), seed=99)
    step(engine, capture_batch, graph=True, capture=True)
    assert engine.step == -1 and not lines  # capture batches are not verify steps and print nothing
    for index in range(7):
        batch = make_verify_batch(bs=2, prefix=30, q_len=9, heads=4, layers=(0, 1), seed=index)
        outs = step(engine, batch, graph=True)
        rail = engine.graph.parity_rail[:3].tolist()
        assert rail == (batch.qo_indptr.tolist() if index % 3 == 0 else [0, 0, 0])
        for layer, out in outs.items():
            assert parity_stats(out, dense_verify_attention(batch, layer))[2] < 1e-2
    engine.flush()
    parity = [m for m in (PARITY.match(line) for line in lines) if m]
    assert [(int(m.group(4)), m.group(3)) for m in parity] == [(0, "graph"), (3, "graph"), (6, "graph")]
    assert all(int(m.group(1)) == 0 and float(m.group(2)) < 1e-2 for m in parity)
    assert sum("shapes" in line for line in lines) == 1


def test_graph_buffers_keep_their_addresses_across_steps() -> None:
    engine = VerifyEngine(q_len=5, heads=2, parity=ParityConfig(False, 1, ()), use_kernel=False, sink=lambda _: None)
    engine.allocate_graph_buffers(max_bs=3, max_context_len=40, device=torch.device("cpu"))
    pointers = set()
    for index in range(3):
        batch = make_verify_batch(bs=3, prefix=20 + index, q_len=5, heads=2, seed=index)
        step(engine, batch, graph=True)
        assert engine.meta is not None and engine.qo_indptr is not None
        pointers.add((engine.meta.keys.data_ptr(), engine.meta.draft_mask.data_ptr(), engine.qo_indptr.data_ptr()))
    assert len(pointers) == 1


def test_parity_never_changes_the_output() -> None:
    batch = make_verify_batch(bs=2, prefix=30, q_len=9, heads=4, layers=(0,), seed=8)
    outs = []
    for parity in (ParityConfig(True, 1, (0,)), ParityConfig(False, 1, (0,))):
        engine = VerifyEngine(q_len=9, heads=4, parity=parity, use_kernel=False, sink=lambda _: None)
        outs.append(step(engine, batch, graph=False)[0])
    assert torch.equal(outs[0], outs[1])
