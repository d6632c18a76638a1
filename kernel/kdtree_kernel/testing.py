"""Random DDTree verify problems in both layouts: this package's contract and SGLang's target-verify inputs.

Used by the GPU tests and the benchmark so that both check the kernel on the same kind of data: random trees
(or chains / stars), ragged prefixes, random non-contiguous pool rows.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch

from .mask import ancestor_mask, pack_draft_mask
from .ops import verify_attention
from .plan import HEAD_DIM, VALUE_DIM
from .reference import verify_attention_reference

MaskKind = Literal["tree", "chain", "star"]


def tree_parents(q_len: int, kind: MaskKind, gen: torch.Generator) -> list[int]:
    """Parent of each draft node (topological order, node 0 the root with parent -1)."""
    if kind == "chain":
        return [i - 1 for i in range(q_len)]
    if kind == "star":
        return [-1] + [0] * (q_len - 1)
    return [-1] + [int(torch.randint(0, i, (1,), generator=gen)) for i in range(1, q_len)]


@dataclass
class VerifyCase:
    bs: int
    q_len: int
    heads: int
    prefix_lens: list[int]
    q: torch.Tensor  # [T, H, 576] bf16
    kv_buffer: torch.Tensor  # [pool, 1, 576] bf16, or float8_e4m3fn (SGLang's fp8 pool: values / kv_scale)
    kv_indptr: torch.Tensor  # int32 [bs + 1], prefix + drafts per request
    kv_indices: torch.Tensor  # [nnz]: prefix rows then draft rows per request
    qo_indptr: torch.Tensor  # int32 [bs + 1]
    draft_mask: torch.Tensor  # int64 [T, words]
    draft_dense: torch.Tensor  # bool [T, q_len]
    # SGLang target-verify layout (prefix-only kv_indices, drafts as extend k/v, flattened custom mask)
    sgl_kv_indptr: torch.Tensor
    sgl_kv_indices: torch.Tensor
    draft_loc: torch.Tensor  # int64 [T] pool rows of the draft tokens
    custom_mask: torch.Tensor  # bool, per request row-major [q_len, prefix + q_len]
    mask_indptr: torch.Tensor  # int64 [bs + 1]
    kv_scale: float = 1.0  # an fp8 pool's descale (SGLang's k_scale = v_scale for the one MLA row)

    @property
    def fp8(self) -> bool:
        return self.kv_buffer.dtype == torch.float8_e4m3fn

    def _scales(self, kwargs: dict[str, object]) -> dict[str, object]:
        """``kwargs`` with an fp8 pool's descales added (explicit ones win); a bf16 case passes them as they are."""
        if not self.fp8:
            return kwargs
        return {"k_scale": self.kv_scale, "v_scale": self.kv_scale, **kwargs}

    def kv_dequantized(self) -> torch.Tensor:
        """The pool as bf16 values (an fp8 pool times its scale; e4m3 times a power of two is exact in bf16)."""
        if not self.fp8:
            return self.kv_buffer
        return (self.kv_buffer.float() * self.kv_scale).to(torch.bfloat16)

    @property
    def max_prefix(self) -> int:
        return max(self.prefix_lens)

    @property
    def kv_tokens(self) -> int:
        return sum(self.prefix_lens) + self.bs * self.q_len

    def run_kernel(
        self,
        sm_scale: float,
        *,
        kv_indices: torch.Tensor | None = None,
        max_prefix_len: int | None = None,
        **kwargs: object,
    ) -> torch.Tensor:
        """verify_attention on this case (its own pool rows unless ``kv_indices`` replaces them), with the
        grid planned for its longest prefix unless ``max_prefix_len`` gives a larger bound (as a CUDA-graph
        runner does); ``kwargs`` (out, lse, workspace) go to the op as they are."""
        return verify_attention(
            self.q,
            self.kv_buffer,
            self.kv_indptr,
            self.kv_indices if kv_indices is None else kv_indices,
            self.qo_indptr,
            self.draft_mask,
            sm_scale,
            q_len=self.q_len,
            max_prefix_len=self.max_prefix if max_prefix_len is None else max_prefix_len,
            **self._scales(kwargs),  # type: ignore[arg-type]
        )

    def reference(self, sm_scale: float, **kwargs: object) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """The fp32 reference on this case; ``kwargs`` (return_lse) go to verify_attention_reference."""
        return verify_attention_reference(
            self.q,
            self.kv_buffer,
            self.kv_indptr,
            self.kv_indices,
            self.qo_indptr,
            self.draft_mask,
            sm_scale,
            **self._scales(kwargs),  # type: ignore[arg-type]
        )


def make_case(
    bs: int,
    prefix: int,
    q_len: int,
    heads: int,
    *,
    kind: MaskKind = "tree",
    ragged: bool = False,
    index_dtype: torch.dtype = torch.int32,
    device: str | torch.device = "cuda",
    seed: int = 0,
    spare_rows: int = 64,
    kv_dtype: torch.dtype = torch.bfloat16,
    kv_scale: float = 1.0,
) -> VerifyCase:
    """A batch of ``bs`` requests with ``prefix`` committed keys each (ragged: uniform in [0, prefix], the
    first request at ``prefix``) and a ``q_len``-node draft of the given shape. ``kv_dtype`` float8_e4m3fn: the
    pool as SGLang stores it with ``--kv-cache-dtype fp8_e4m3`` (standard-normal values divided by ``kv_scale``,
    rounded to e4m3; keep 1 / kv_scale well under 448 / 6 so that no value saturates)."""
    gen = torch.Generator().manual_seed(seed)
    if ragged and bs > 1:
        others = torch.randint(0, prefix + 1, (bs - 1,), generator=gen).tolist()
        prefix_lens = [prefix, *others]
    else:
        prefix_lens = [prefix] * bs
    total = sum(prefix_lens) + bs * q_len
    pool = total + spare_rows
    dev_gen = torch.Generator(device=device).manual_seed(seed)
    kv_buffer = torch.randn(pool, 1, HEAD_DIM, device=device, dtype=torch.bfloat16, generator=dev_gen)
    if kv_dtype == torch.float8_e4m3fn:
        kv_buffer = (kv_buffer.float() / kv_scale).to(kv_dtype)
    elif kv_dtype != torch.bfloat16:
        raise ValueError(f"kv_dtype must be bf16 or float8_e4m3fn, got {kv_dtype}")
    q = torch.randn(bs * q_len, heads, HEAD_DIM, device=device, dtype=torch.bfloat16, generator=dev_gen)
    rows = torch.randperm(pool, device=device, generator=dev_gen)[:total]
    prefix_rows: list[torch.Tensor] = []
    draft_rows: list[torch.Tensor] = []
    at = 0
    for p in prefix_lens:
        prefix_rows.append(rows[at : at + p])
        at += p
    for _ in range(bs):
        draft_rows.append(rows[at : at + q_len])
        at += q_len
    kv_indices = torch.cat([torch.cat([p, d]) for p, d in zip(prefix_rows, draft_rows, strict=True)])
    lens = torch.tensor([p + q_len for p in prefix_lens], dtype=torch.int64)
    kv_indptr = torch.zeros(bs + 1, dtype=torch.int32)
    kv_indptr[1:] = torch.cumsum(lens, 0)
    qo_indptr = torch.arange(0, (bs + 1) * q_len, q_len, dtype=torch.int32)
    dense = [ancestor_mask(tree_parents(q_len, kind, gen)) for _ in range(bs)]
    draft_dense = torch.cat(dense).to(device)
    sgl_indptr = torch.zeros(bs + 1, dtype=torch.int32)
    sgl_indptr[1:] = torch.cumsum(torch.tensor(prefix_lens, dtype=torch.int64), 0)
    custom = [
        torch.cat([torch.ones(q_len, p, dtype=torch.bool), d], 1).reshape(-1)
        for p, d in zip(prefix_lens, dense, strict=True)
    ]
    mask_indptr = torch.zeros(bs + 1, dtype=torch.int64)
    mask_indptr[1:] = torch.cumsum(torch.tensor([q_len * (p + q_len) for p in prefix_lens]), 0)
    return VerifyCase(
        bs=bs,
        q_len=q_len,
        heads=heads,
        prefix_lens=prefix_lens,
        q=q,
        kv_buffer=kv_buffer,
        kv_indptr=kv_indptr.to(device),
        kv_indices=kv_indices.to(index_dtype),
        qo_indptr=qo_indptr.to(device),
        draft_mask=pack_draft_mask(draft_dense),
        draft_dense=draft_dense,
        sgl_kv_indptr=sgl_indptr.to(device),
        sgl_kv_indices=torch.cat(prefix_rows).to(torch.int64) if prefix_rows else rows[:0],
        draft_loc=torch.cat(draft_rows).to(torch.int64),
        custom_mask=torch.cat(custom).to(device),
        mask_indptr=mask_indptr.to(device),
        kv_scale=kv_scale if kv_dtype == torch.float8_e4m3fn else 1.0,
    )


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| in float32 (NaN propagates, so a NaN never passes a <= check)."""
    diff = (out.float() - ref.float()).norm()
    return float(diff / ref.float().norm().clamp_min(1e-30))


__all__ = ["VALUE_DIM", "MaskKind", "VerifyCase", "ancestor_mask", "make_case", "rel_error", "tree_parents"]


def capture_graph(call: Callable[[], object]) -> torch.cuda.CUDAGraph:
    """A CUDA graph of one ``call``, captured after one eager run on a side stream (module load, attribute setup
    happen outside the capture), as a graph runner captures it. Replay it with ``.replay()``."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        call()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()
    return graph
