"""Stand-ins for SGLang in the backend tests: a torch version of the Triton ``extend_attention_fwd`` in
target-verify use (CPU tests: prefix keys from ``kv_indices``, the drafts from ``k_extend``/``v_extend``, mask
rows from ``custom_mask``; requests with zero query rows (``qo_indptr``) are skipped, as the Triton programs
return at once for them), and :class:`GraphServer`, the CUDA-graph runner's protocol around the verify engine."""

from __future__ import annotations

from collections.abc import Callable

import torch
from kdtree_backend.batch import VerifyBatch
from kdtree_backend.engine import VerifyEngine


def target_verify_extend(
    extend_attention_fwd: Callable[..., None],
    batch: VerifyBatch,
    layer: int,
    out: torch.Tensor,
    qo_indptr: torch.Tensor,
    *,
    pool: torch.Tensor | None = None,
    kv_scale: float = 1.0,
) -> None:
    """SGLang's call for TARGET_VERIFY (triton_backend.forward_extend -> extend_attention_fwd) on ``batch``: the
    real Triton kernel (GPU tests) or :func:`extend_attention_emulated` (CPU). ``pool``: the layer's pool as the
    kernel reads it (an fp8 pool with its ``kv_scale``); the drafts' K is what forward_extend hands over (bf16)."""
    k_ext = batch.k_extend(layer).contiguous()
    kv = batch.kv_buffers[layer] if pool is None else pool
    extend_attention_fwd(
        batch.q[layer],
        k_ext,
        k_ext[..., :512].contiguous(),
        out,
        kv,
        kv[..., :512],
        qo_indptr,
        batch.kv_indptr,
        batch.kv_indices,
        batch.custom_mask,
        True,
        batch.mask_indptr,
        batch.q_len,
        kv_scale,
        kv_scale,
        sm_scale=batch.sm_scale,
    )


def extend_attention_emulated(
    q_extend: torch.Tensor,
    k_extend: torch.Tensor,
    v_extend: torch.Tensor,
    o_extend: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    custom_mask: torch.Tensor,
    is_causal: bool,
    mask_indptr: torch.Tensor,
    max_len_extend: int,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    sm_scale: float | None = None,
    **_: object,
) -> None:
    qo, kv, mp = qo_indptr.tolist(), kv_indptr.tolist(), mask_indptr.tolist()
    keys_pool = k_buffer.reshape(k_buffer.shape[0], -1).float()
    vals_pool = v_buffer.reshape(v_buffer.shape[0], -1).float()
    dv = o_extend.shape[-1]
    for b in range(len(qo) - 1):
        n = qo[b + 1] - qo[b]
        if n <= 0:
            continue
        rows = kv_indices[kv[b] : kv[b + 1]].long()
        prefix = rows.numel()
        keys = torch.cat([keys_pool[rows], k_extend[qo[b] : qo[b + 1]].reshape(n, -1).float()])
        vals = torch.cat([vals_pool[rows][:, :dv], v_extend[qo[b] : qo[b + 1]].reshape(n, -1).float()[:, :dv]])
        visible = custom_mask[mp[b] : mp[b] + n * (prefix + n)].view(n, prefix + n).bool()
        scores = torch.einsum("thd,sd->ths", q_extend[qo[b] : qo[b + 1]].float(), keys) * float(sm_scale or 1.0)
        scores = scores.masked_fill(~visible[:, None, :], float("-inf"))
        o_extend[qo[b] : qo[b + 1]] = torch.einsum("ths,sd->thd", scores.softmax(-1), vals).to(o_extend.dtype)


class GraphServer:
    """SGLang's CUDA-graph runner around a :class:`VerifyEngine`, on static buffers: graphs captured once for one
    batch size, then per step, in the runner's order: the committed prefix in the pool and the step's metadata in
    the static buffers, the out-graph hook (``prepare``), the replay (the draft K/V saved to the pool, then each
    layer's attention), and after it other work that reuses the step's draft slots (rejected drafts are freed).

    On CUDA the replay is a real ``torch.cuda.CUDAGraph`` (no Python runs in it); elsewhere the engine's forward
    runs again, in the same order and with the same buffers: the CPU emulation of the graph protocol."""

    def __init__(self, engine: VerifyEngine, template: VerifyBatch, *, max_context: int, workspace_bytes: int = 0):
        self.engine = engine
        self.template = template
        self.layers = template.layers
        device = template.q[template.layers[0]].device
        self.device = device
        bs, q_len = template.bs, template.q_len
        pool = template.kv_buffers[self.layers[0]]
        engine.allocate_graph_buffers(
            max_bs=bs,
            max_context_len=max_context,
            device=device,
            workspace_bytes=workspace_bytes,
            kv_row_shape=tuple(pool.shape[1:]),
            kv_dtype=pool.dtype,
        )
        self.pools = {layer: template.kv_buffers[layer].clone() for layer in self.layers}
        self.q = {layer: template.q[layer].clone() for layer in self.layers}
        self.outs = {
            layer: torch.zeros(bs * q_len, template.heads, 512, dtype=template.q[layer].dtype, device=device)
            for layer in self.layers
        }
        self.kv_indptr = template.kv_indptr.clone()
        self.kv_indices = torch.zeros(bs * max_context, dtype=torch.long, device=device)
        self.custom_mask = torch.zeros(bs * q_len * (max_context + q_len), dtype=torch.uint8, device=device)
        self.mask_indptr = template.mask_indptr.clone()
        self.out_cache_loc = template.out_cache_loc.clone()
        self.qo_indptr = template.qo_indptr.long()
        self.graph: torch.cuda.CUDAGraph | None = None
        self.load(template)
        self.prepare(capture=True)
        self._forward()  # the capture run (on CUDA: the warm-up the runner does before capturing)
        if device.type == "cuda":
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                self._forward()

    def load(self, batch: VerifyBatch) -> None:
        """The step's metadata into the static buffers and its committed prefix into the pools (drafts zeroed)."""
        self.kv_indptr.copy_(batch.kv_indptr)
        self.kv_indices[: batch.kv_indices.numel()].copy_(batch.kv_indices)
        self.custom_mask[: batch.custom_mask.numel()].copy_(batch.custom_mask)
        self.mask_indptr.copy_(batch.mask_indptr)
        self.out_cache_loc.copy_(batch.out_cache_loc)
        for layer in self.layers:
            self.q[layer].copy_(batch.q[layer])
            self.pools[layer].copy_(batch.kv_buffers[layer])
            _rows(self.pools[layer])[batch.out_cache_loc] = 0  # the drafts' K/V are saved by the replay itself

    def prepare(self, capture: bool = False, padding: int = 0) -> None:
        self.engine.prepare(
            kv_indptr=self.kv_indptr,
            kv_indices=self.kv_indices,
            out_cache_loc=self.out_cache_loc,
            custom_mask=self.custom_mask,
            mask_indptr=self.mask_indptr,
            qo_indptr=self.qo_indptr,
            bs=self.template.bs,
            graph=True,
            capture=capture,
            kv_buffer_shape=self.pools[self.layers[0]].shape,
            padding=padding,
        )

    def _forward(self) -> None:
        for layer in self.layers:
            self.engine.forward(layer, self.q[layer], self.pools[layer], self.outs[layer], self.template.sm_scale)

    def replay(self) -> None:
        if self.graph is not None:
            self.graph.replay()
        else:
            self._forward()

    def step(self, batch: VerifyBatch, *, padding: int = 0) -> dict[int, torch.Tensor]:
        """One verify step of ``batch`` (the template's shapes); the outputs as the replay left them (copies)."""
        self.load(batch)
        self.prepare(padding=padding)
        for layer in self.layers:  # the replay saves the drafts' K/V before the layer's attention
            _rows(self.pools[layer])[batch.out_cache_loc] = _rows(batch.kv_buffers[layer])[batch.out_cache_loc]
        self.replay()
        outs = {layer: out.clone() for layer, out in self.outs.items()}
        for layer in self.layers:  # the draft slots freed after the step and reused (a prefill, say)
            _rows(self.pools[layer])[batch.out_cache_loc] = 7
        return outs


def _rows(pool: torch.Tensor) -> torch.Tensor:
    """The pool as bytes per row (float8 pools cannot be indexed or filled as such everywhere)."""
    return pool.view(torch.uint8)


def rows_read(batch: VerifyBatch) -> torch.Tensor:
    """The pool rows a verify step of ``batch`` reads, per request its prefix then its drafts (from SGLang's
    ``req_to_token``, independent of the code under test)."""
    return torch.cat(
        [
            batch.req_to_token[int(req), : int(seq_len) + batch.q_len].long()
            for req, seq_len in zip(batch.req_pool_indices.tolist(), batch.seq_lens.tolist(), strict=True)
        ]
    ).to(batch.kv_indices.device)
