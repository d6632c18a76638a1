"""Checks against the real SGLang 0.5.23, in a process of their own (SGLang's import has global side effects).

    python tests/backend/sglang_probe.py   -> one JSON object on the last stdout line

Run by tests/backend/test_sglang_plugin.py. On CPU, so the verify path is the reference and SGLang's Triton
``extend_attention_fwd`` is replaced by a torch emulation (tests/backend/emulation.py); everything else -
plugin loading, argument parsing, the registry, upstream's ``forward_extend`` around our hooks - is SGLang's.
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import io
import json
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torchvision_shim

SHIMMED = torchvision_shim.install_if_needed()

import torch  # noqa: E402

OVERRIDDEN = (
    "__init__",
    "init_cuda_graph_state",
    "init_forward_metadata",
    "init_forward_metadata_out_graph",
    "forward_extend",
    "_forward_extend_kernel",
)


def parse_backend_args(argv: list[str]) -> dict[str, Any] | str:
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            ns = parser.parse_args(["--model-path", "dummy", *argv])
    except SystemExit:
        return "rejected: " + err.getvalue().strip().splitlines()[-1]
    return {
        "attention_backend": ns.attention_backend,
        "prefill_attention_backend": ns.prefill_attention_backend,
        "decode_attention_backend": ns.decode_attention_backend,
        "speculative_draft_attention_backend": ns.speculative_draft_attention_backend,
    }


def signature_key(fn: Any) -> list[tuple[str, str, str]]:
    return [(p.name, str(p.kind), repr(p.default)) for p in inspect.signature(fn).parameters.values()]


class FakePool:
    """The MLA token pool surface that upstream forward_extend touches."""

    def __init__(self, buffers: dict[int, torch.Tensor]) -> None:
        self.buffers = buffers
        self.start_layer = min(buffers)
        self.writes = 0

    def get_key_buffer(self, layer_id: int) -> torch.Tensor:
        return self.buffers[layer_id]

    def get_value_buffer(self, layer_id: int) -> torch.Tensor:
        return self.buffers[layer_id][..., :512]

    def set_kv_buffer(self, layer: Any, loc: Any, k: torch.Tensor, v: torch.Tensor, *args: Any, **kw: Any) -> None:
        self.buffers[layer.layer_id][loc.loc] = k.reshape(k.shape[0], 1, -1).to(self.buffers[layer.layer_id].dtype)
        self.writes += 1


def backend_forward_check() -> dict[str, Any]:
    """KdtreeAttnBackend.forward_extend through upstream TritonAttnBackend.forward_extend on a verify batch."""
    from emulation import extend_attention_emulated
    from kdtree_backend.backend import KdtreeAttnBackend
    from kdtree_backend.batch import dense_verify_attention, make_verify_batch
    from kdtree_backend.config import ParityConfig
    from kdtree_backend.engine import VerifyEngine
    from kdtree_backend.lines import OncePer
    from kdtree_backend.verify import parity_stats
    from sglang.kernels.ops.attention.extend_attention import extend_attention_fwd
    from sglang.srt.layers.attention.triton_backend import ForwardMetadata
    from sglang.srt.layers.radix_attention import AttentionType
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    layers = (0, 1)
    batch = make_verify_batch(bs=3, prefix=40, q_len=9, heads=8, layers=layers, seed=4)
    draft_k = {layer: batch.k_extend(layer).clone() for layer in layers}
    # The pool before the step: the drafts' rows are not written yet; upstream's forward_extend saves them.
    pools = {layer: batch.kv_buffers[layer].clone() for layer in layers}
    for layer in layers:
        pools[layer][batch.out_cache_loc] = 0
    lines: list[str] = []

    backend = KdtreeAttnBackend.__new__(KdtreeAttnBackend)
    pool = FakePool(pools)
    backend.__dict__.update(
        token_to_kv_pool=pool,
        use_dense_fp8_chunked_prefill=False,
        dcp_size=1,
        allow_bidirectional_attention_in_extend=False,
        enable_deterministic=False,
        use_verify_shared_kv=False,
        use_verify_splitkv=False,
        dllm_attention=None,
        page_size=1,
        target_verify_num_tokens_per_req=9,  # upstream's verify width (the step's spec_info may override it)
        extend_attention_fwd=extend_attention_emulated,
        kdtree_engine=VerifyEngine(
            q_len=9, heads=8, parity=ParityConfig(True, 1, (1,)), use_kernel=False, sink=lines.append
        ),
        _kdtree_fallback=OncePer(lines.append),
        _kdtree_layer_reason={},
        _kdtree_layer=None,
        _kdtree_extend_signature=inspect.signature(extend_attention_fwd),
    )
    backend.forward_metadata = ForwardMetadata(
        attn_logits=None,
        attn_lse=None,
        max_extend_len=9,
        num_kv_splits=None,
        kv_indptr=batch.kv_indptr,
        kv_indices=batch.kv_indices,
        qo_indptr=batch.qo_indptr,
        custom_mask=batch.custom_mask,
        mask_indptr=batch.mask_indptr,
        window_kv_indptr=None,
        window_kv_indices=None,
        window_num_kv_splits=None,
        window_kv_offsets=None,
    )
    forward_batch = SimpleNamespace(
        forward_mode=ForwardMode.TARGET_VERIFY,
        req_pool_indices=batch.req_pool_indices,
        seq_lens=batch.seq_lens,
        seq_lens_cpu=batch.seq_lens.cpu(),
        seq_lens_sum=int(batch.seq_lens.sum()),
        out_cache_loc=batch.out_cache_loc,
        out_cache_loc_is_physical=False,
        mha_one_shot=False,
        attn_attend_prefix_cache=None,
        extend_seq_lens_cpu=None,
    )
    backend._kdtree_prepare(forward_batch, graph=False)

    pools[5] = pools[0]  # layer 5: the same weights as layer 0, but with a logit cap (kernel cannot serve it)

    def layer_of(layer_id: int, logit_cap: float = 0.0) -> SimpleNamespace:
        return SimpleNamespace(
            layer_id=layer_id,
            qk_head_dim=576,
            v_head_dim=512,
            tp_q_head_num=8,
            scaling=batch.sm_scale,
            logit_cap=logit_cap,
            logit_capping_method="tanh",
            k_scale=None,
            v_scale=None,
            is_cross_attention=False,
            attn_type=AttentionType.DECODER,
            sliding_window_size=None,
            xai_temperature_len=-1,
        )

    rels = {}
    for layer in layers:
        q = batch.q[layer].reshape(batch.tokens, -1)  # RadixAttention hands q flattened per token
        k = draft_k[layer]
        out = backend.forward_extend(q, k, k[..., :512], layer_of(layer), forward_batch)
        got = out.view(batch.tokens, 8, 512)
        rels[layer] = parity_stats(got, dense_verify_attention(batch, layer))[2]
    # A layer the kernel cannot serve (logit cap) goes to upstream's call, and says so once.
    capped = backend.forward_extend(
        batch.q[0].reshape(batch.tokens, -1), draft_k[0], draft_k[0][..., :512], layer_of(5, 30.0), forward_batch
    )
    backend.forward_extend(
        batch.q[0].reshape(batch.tokens, -1), draft_k[0], draft_k[0][..., :512], layer_of(5, 30.0), forward_batch
    )
    return {
        "rel_by_layer": rels,
        "kv_writes": pool.writes,
        "drafts_saved": all(torch.equal(pools[layer][batch.out_cache_loc], draft_k[layer]) for layer in layers),
        "lines": lines,
        "capped_rel": parity_stats(capped.view(batch.tokens, 8, 512), dense_verify_attention(batch, 0))[2],
    }


def main() -> None:
    import sglang

    result: dict[str, Any] = {"sglang_version": sglang.__version__, "torchvision_stand_in": SHIMMED}
    result["before_plugins"] = parse_backend_args(["--attention-backend", "kdtree"])
    from sglang.srt.plugins import load_plugins

    load_plugins()
    from kdtree_backend.backend import KdtreeAttnBackend
    from kdtree_backend.plugin import create_kdtree_backend, register
    from sglang.srt.arg_groups.choices import ATTENTION_BACKEND_CHOICES
    from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS
    from sglang.srt.layers.attention.triton_backend import TritonAttnBackend

    register()  # idempotent: a second call must not duplicate the choice
    result["choice_count"] = ATTENTION_BACKEND_CHOICES.count("kdtree")
    result["registry_factory"] = ATTENTION_BACKENDS.get("kdtree") is create_kdtree_backend
    result["args_kdtree"] = parse_backend_args(
        ["--attention-backend", "kdtree", "--speculative-draft-attention-backend", "triton"]
    )
    result["args_split"] = parse_backend_args(
        ["--prefill-attention-backend", "kdtree", "--decode-attention-backend", "triton"]
    )
    result["subclass"] = issubclass(KdtreeAttnBackend, TritonAttnBackend)
    result["overrides"] = sorted(
        name for name, value in vars(KdtreeAttnBackend).items() if callable(value) and hasattr(TritonAttnBackend, name)
    )
    result["signature_mismatches"] = [
        name
        for name in OVERRIDDEN
        if signature_key(getattr(KdtreeAttnBackend, name)) != signature_key(getattr(TritonAttnBackend, name))
    ]
    result["forward"] = backend_forward_check()
    print(json.dumps(result, default=str))


if __name__ == "__main__":
    main()
