"""``KdtreeAttnBackend``: SGLang's TritonAttnBackend with TARGET_VERIFY (absorbed MLA) routed to the kernel.

Overrides, all calling the upstream method first or instead only for verify:
  * ``__init__``: decide once which static conditions rule the kernel out (each reason printed once);
  * ``init_cuda_graph_state``: preallocate the engine's graph buffers (capture slots included);
  * ``init_forward_metadata`` (eager) / ``init_forward_metadata_out_graph`` (CUDA-graph capture and replay):
    after upstream has built its metadata, marshal it for the kernel (:mod:`kdtree_backend.marshal`);
  * ``forward_extend``: for a verify layer the kernel can serve, mark the layer and let upstream run (it saves
    the draft K/V to the pool first, as SGLang requires). A caller that wrote the drafts' K/V into the pool
    itself passes ``k = v = None`` (``save_kv_cache=False``; SGLang's own MLA attention kit does): that call is
    served too, since upstream then reads the drafts back from the pool at ``out_cache_loc`` for its reference
    and the kernel reads every key, drafts included, from the pool (docs/sglang-verify.md, "Who writes the
    drafts");
  * ``_forward_extend_kernel``: upstream's single call site of ``extend_attention_fwd``; for the marked layer
    the kernel runs instead, and parity runs upstream's call on the same arguments into a scratch buffer.
Anything else (prefill extend, decode, draft extend, unsupported verify) is upstream Triton unchanged.
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any

import torch
from sglang.srt.layers.attention.triton_backend import TritonAttnBackend

from .config import load_config
from .engine import VerifyEngine
from .lines import OncePer, ParityIdentity, format_fallback
from .routing import call_fallback_reason, kernel_max_q_len, layer_fallback_reason, static_fallback_reason

if TYPE_CHECKING:
    from sglang.srt.layers.radix_attention import RadixAttention
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch
    from sglang.srt.model_executor.model_runner import ModelRunner


class KdtreeAttnBackend(TritonAttnBackend):
    """Triton everywhere, the kdtree kernel for DDTree target-verify of absorbed MLA."""

    def __init__(
        self,
        model_runner: ModelRunner,
        skip_prefill: bool = False,
        kv_indptr_buf: torch.Tensor | None = None,
        *,
        dllm_fa4: bool = False,
    ):
        super().__init__(model_runner, skip_prefill, kv_indptr_buf, dllm_fa4=dllm_fa4)
        config = load_config()
        self._kdtree_fallback = OncePer()
        self._kdtree_layer_reason: dict[int, str | None] = {}
        self._kdtree_layer: Any = None
        self._kdtree_step_reason: str | None = None  # why this step's verify is not ours (set by _kdtree_prepare)
        self._kdtree_extend_signature = inspect.signature(self.extend_attention_fwd)
        reason = None
        if skip_prefill:
            reason = "skip_prefill"
        else:
            reason = static_fallback_reason(
                use_mla=self.use_mla,
                v_head_dim=self.v_head_dim,
                page_size=self.page_size,
                kv_cache_dtype=getattr(model_runner, "kv_cache_dtype", None),
                dcp_size=self.dcp_size,
                sliding_window=self.use_sliding_window_kv_pool
                or (self.sliding_window_size is not None and self.sliding_window_size > 0),
                deterministic=bool(self.enable_deterministic),
                use_kernel=config.use_kernel,
                q_len=self.target_verify_num_tokens_per_req,
                device=torch.device(self.device),
            )
        self.kdtree_engine: VerifyEngine | None = None
        if reason is not None:
            self._kdtree_note_fallback(reason)
        else:
            self.kdtree_engine = VerifyEngine(
                q_len=self.target_verify_num_tokens_per_req,
                heads=self.num_head,
                parity=config.parity,
                use_kernel=True,
                capture_in_graphs=config.capture_in_graphs,
                v_head_dim=self.v_head_dim,
                # Each TP rank prints its own parity lines; the gate needs passing lines from every rank.
                identity=ParityIdentity.from_env(tp=int(getattr(model_runner, "tp_rank", 0) or 0)),
            )
            # Verify is ours; upstream's topk == 1 verify kernels would otherwise take it first.
            self.use_verify_shared_kv = False
            self.use_verify_splitkv = False

    # ---- helpers -------------------------------------------------------------------------------------
    def _kdtree_note_fallback(self, reason: str) -> None:
        self._kdtree_fallback(reason, lambda: format_fallback(reason, path="triton"))

    def _kdtree_verify_layer_ok(self, layer: RadixAttention) -> bool:
        if layer.layer_id not in self._kdtree_layer_reason:
            self._kdtree_layer_reason[layer.layer_id] = layer_fallback_reason(layer)
        reason = self._kdtree_layer_reason[layer.layer_id]
        if reason is not None:
            self._kdtree_note_fallback(reason)
        return reason is None

    def _kdtree_step_width(self, forward_batch: ForwardBatch) -> int:
        """This step's draft tokens per request, by upstream's own rule (``spec_info.num_tokens_per_req``, or the
        capture width where that is not positive): it may differ from the width at start (adaptive speculation,
        or a runner whose static width is 1, as the attention kit's mock runner, whose spec algorithm is NONE)."""
        return int(self._target_verify_num_tokens_per_req(getattr(forward_batch, "spec_info", None)))

    def _kdtree_prepare(self, forward_batch: ForwardBatch, *, graph: bool, capture: bool = False) -> None:
        engine = self.kdtree_engine
        assert engine is not None
        metadata = self.forward_metadata
        self._kdtree_step_reason = None
        if metadata is None or metadata.custom_mask is None:
            engine.meta = None
            self._kdtree_step_reason = "no_custom_mask"
            return
        width = self._kdtree_step_width(forward_batch)
        if width != engine.q_len:
            buffers = engine.graph
            if graph and buffers is not None:
                # The captured buffers are sized for the width they were allocated with: never serve another.
                engine.meta = None
                self._kdtree_step_reason = "q_len_changed"
                return
            if not 1 <= width <= kernel_max_q_len():
                engine.meta = None
                self._kdtree_step_reason = "q_len_out_of_range"
                return
            engine.q_len = width  # eager: the engine marshals and launches per step, at the step's width
        seq_lens_cpu = getattr(forward_batch, "seq_lens_cpu", None)
        bs = len(forward_batch.req_pool_indices)
        engine.prepare(
            kv_indptr=metadata.kv_indptr,
            kv_indices=metadata.kv_indices,
            out_cache_loc=forward_batch.out_cache_loc,
            custom_mask=metadata.custom_mask,
            mask_indptr=metadata.mask_indptr,
            qo_indptr=metadata.qo_indptr,
            bs=bs,
            graph=graph,
            capture=capture,
            prefix_sum=getattr(forward_batch, "seq_lens_sum", None),
            max_prefix_len=int(seq_lens_cpu[:bs].max()) if seq_lens_cpu is not None and bs else None,
            kv_buffer_shape=tuple(self.token_to_kv_pool.get_key_buffer(self.token_to_kv_pool.start_layer).shape),
            padding=int(getattr(forward_batch, "num_padding", 0) or 0),  # the replay view's padded requests
        )

    # ---- SGLang hooks --------------------------------------------------------------------------------
    def init_cuda_graph_state(
        self,
        max_bs: int,
        max_num_tokens: int,
        kv_indices_buf: torch.Tensor | None = None,
        cuda_graph_num_kv_splits_buf: torch.Tensor | None = None,
    ):
        super().init_cuda_graph_state(max_bs, max_num_tokens, kv_indices_buf, cuda_graph_num_kv_splits_buf)
        engine = self.kdtree_engine
        if engine is None:
            return
        # The graphs are captured at max_num_tokens // max_bs tokens per request (SGLang's capture width for
        # target verify); size the buffers for that width, not the one seen at start.
        width = max_num_tokens // max_bs if max_bs else 0
        if width != engine.q_len and max_num_tokens == width * max_bs and 1 <= width <= kernel_max_q_len():
            engine.q_len = width
        import kdtree_kernel

        key_buffer = self.token_to_kv_pool.get_key_buffer(self.token_to_kv_pool.start_layer)
        fp8 = key_buffer.dtype == torch.float8_e4m3fn
        workspace_size = getattr(kdtree_kernel, "workspace_size", None)
        workspace = (
            int(workspace_size(max_bs, engine.q_len, engine.heads, self.max_context_len, self.device, fp8=fp8))
            if workspace_size is not None and engine.use_kernel  # the reference path (CPU tests) needs none
            else 0
        )
        engine.allocate_graph_buffers(
            max_bs=max_bs,
            max_context_len=self.max_context_len,
            device=torch.device(self.device),
            dtype=torch.bfloat16 if fp8 else key_buffer.dtype,  # the outputs' dtype (an fp8 pool's model is bf16)
            workspace_bytes=workspace,
            kv_row_shape=tuple(key_buffer.shape[1:]),
            kv_dtype=key_buffer.dtype,
        )

    def init_forward_metadata(self, forward_batch: ForwardBatch):
        super().init_forward_metadata(forward_batch)
        if self.kdtree_engine is not None and forward_batch.forward_mode.is_target_verify():
            self._kdtree_prepare(forward_batch, graph=False)

    def init_forward_metadata_out_graph(
        self,
        forward_batch: ForwardBatch,
        in_capture: bool = False,
    ):
        super().init_forward_metadata_out_graph(forward_batch, in_capture)
        engine = self.kdtree_engine
        if engine is not None and engine.graph is not None and forward_batch.forward_mode.is_target_verify():
            self._kdtree_prepare(forward_batch, graph=True, capture=in_capture)

    def forward_extend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        layer: RadixAttention,
        forward_batch: ForwardBatch,
        save_kv_cache=True,
        sinks=None,
        score_mod=None,
        aux_tensors=None,
    ):
        engine = self.kdtree_engine
        ours = engine is not None and forward_batch.forward_mode.is_target_verify()
        if ours:
            reason = call_fallback_reason(k, v, sinks, score_mod, aux_tensors)
            if reason is None and (engine is None or engine.meta is None):
                reason = self._kdtree_step_reason or "no_custom_mask"
            if reason is not None:
                self._kdtree_note_fallback(reason)
                ours = False
            else:
                ours = self._kdtree_verify_layer_ok(layer)
        if not ours:
            return super().forward_extend(q, k, v, layer, forward_batch, save_kv_cache, sinks, score_mod, aux_tensors)
        self._kdtree_layer = layer
        try:
            return super().forward_extend(q, k, v, layer, forward_batch, save_kv_cache, sinks, score_mod, aux_tensors)
        finally:
            self._kdtree_layer = None

    def _forward_extend_kernel(self, layer, *args, **kwargs):
        if self._kdtree_layer is not layer or self.kdtree_engine is None:
            return super()._forward_extend_kernel(layer, *args, **kwargs)
        bound = self._kdtree_extend_signature.bind(*args, **kwargs)
        values = bound.arguments
        upstream = super()._forward_extend_kernel

        def triton_reference(out: torch.Tensor, qo_indptr: torch.Tensor) -> None:
            call = dict(values)
            call["o_extend"] = out
            call["qo_indptr"] = qo_indptr
            upstream(layer, **call)

        self.kdtree_engine.forward(
            layer.layer_id,
            values["q_extend"],
            values["k_buffer"],
            values["o_extend"],
            float(values["sm_scale"]),
            triton_reference,
            k_scale=float(values.get("k_scale", 1.0)),
            v_scale=float(values.get("v_scale", 1.0)),
        )
        return None
