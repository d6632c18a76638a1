"""The stand-in's target model: a tiny transformer with seeded weights whose attention is DeepSeek-style MLA of the
production shape (one ``[Dl + Dr] = 576`` latent per token, shared by every head; ``heads`` query heads per TP
rank), so that its verify calls are the ones the kdtree backend makes on a GPU host.

Everything else is as small as it can be (hidden size 64, one attention per layer id, no MLP): the stand-in has
to decode on two shared CPU cores. Per layer: the token's latent ``kv = rope(rms(h) @ W_kv)`` goes to the KV pool,
each rank's queries ``q = rope(rms(h) @ W_q[rank])`` attend over it (the caller runs that attention: the
backend's verify path), and ``h += sum over ranks of attn @ W_o[rank]`` (the all-reduce of tensor parallelism).
The next token is ``argmax(rms(h) @ W_out)``. The residual keeps a strong share of the current token's embedding,
so greedy decoding settles into the repeating patterns that an n-gram drafter can predict (accepted drafts), and
the attention's share is large enough that a wrong attention changes the answers.

Pure torch, deterministic for a seed (same weights in every process), no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .batch import DL, DR

D = DL + DR
HIDDEN = 64
EMBED_ROWS = 4096  # token ids are folded onto this many embedding rows (prompt ids may be any 31-bit integer)
VOCAB = 128  # the model's output ids: 0..VOCAB-1
ROPE_BASE = 10000.0
ATTENTION_GAIN = 0.2  # the attention's weight in the residual, against the token embedding's 1 (measured:
# greedy answers then accept ~2.9 tokens per verify step of 9 nodes, and a wrong attention changes most answers)


@dataclass(frozen=True)
class ModelShape:
    heads: int  # query heads per TP rank
    layers: tuple[int, ...]  # the layer ids (each one attention, in this order)
    tp_size: int
    seed: int = 0


def _rms(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


def rope(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Rotary embedding on the last ``Dr`` dims of ``x [n, ..., D]`` at ``positions [n]`` (the latent part stays)."""
    half = DR // 2
    freqs = ROPE_BASE ** (-torch.arange(half, dtype=torch.float32) / half)
    angles = positions.float()[:, None] * freqs[None, :]  # [n, half]
    shape = (x.shape[0],) + (1,) * (x.dim() - 2) + (half,)
    cos, sin = angles.cos().view(shape), angles.sin().view(shape)
    latent, r = x[..., :DL], x[..., DL:]
    r1, r2 = r[..., :half], r[..., half:]
    return torch.cat([latent, r1 * cos - r2 * sin, r1 * sin + r2 * cos], dim=-1)


class TinyModel:
    """Seeded weights and the dense parts of the forward pass; the attention itself is the caller's."""

    def __init__(self, shape: ModelShape) -> None:
        self.shape = shape
        gen = torch.Generator().manual_seed(0x5EED + shape.seed)

        def normal(*size: int, std: float) -> torch.Tensor:
            return torch.randn(*size, generator=gen) * std

        self.embed = normal(EMBED_ROWS, HIDDEN, std=1.0)
        self.w_out = normal(HIDDEN, VOCAB, std=HIDDEN**-0.5)
        self.w_kv: dict[int, torch.Tensor] = {}
        self.w_q: dict[int, list[torch.Tensor]] = {}
        self.w_o: dict[int, list[torch.Tensor]] = {}
        heads_total = shape.heads * shape.tp_size
        for layer in shape.layers:
            self.w_kv[layer] = normal(HIDDEN, D, std=HIDDEN**-0.5)
            self.w_q[layer] = [normal(HIDDEN, shape.heads * D, std=HIDDEN**-0.5) for _ in range(shape.tp_size)]
            # attention outputs are convex mixtures of latents (~unit elements): scaled so the sum over all heads
            # of every rank adds about ATTENTION_GAIN times an embedding's norm
            std = ATTENTION_GAIN * (heads_total * DL) ** -0.5
            self.w_o[layer] = [normal(shape.heads * DL, HIDDEN, std=std) for _ in range(shape.tp_size)]

    def draft_table(self, top: int = 2) -> torch.Tensor:
        """The draft model: the target without its attention (the residual is the token's embedding alone):
        ``[EMBED_ROWS, top]`` likeliest next tokens of every embedding row, best first."""
        return (_rms(self.embed) @ self.w_out).topk(top, dim=-1).indices

    def embed_tokens(self, tokens: torch.Tensor) -> torch.Tensor:
        """``[n] int64 -> [n, HIDDEN]`` float32."""
        return self.embed[tokens.long() % EMBED_ROWS]

    def latents(self, hidden: torch.Tensor, positions: torch.Tensor, layer: int) -> torch.Tensor:
        """The tokens' MLA latents for the KV pool: ``[n, D]`` float32 (rope on the last Dr dims)."""
        return rope(_rms(hidden) @ self.w_kv[layer], positions)

    def queries(self, hidden: torch.Tensor, positions: torch.Tensor, layer: int, rank: int) -> torch.Tensor:
        """Rank ``rank``'s queries: ``[n, heads, D]`` float32."""
        q = (_rms(hidden) @ self.w_q[layer][rank]).view(hidden.shape[0], self.shape.heads, D)
        return rope(q, positions)

    def attention_output(self, attn: torch.Tensor, layer: int, rank: int) -> torch.Tensor:
        """Rank ``rank``'s share of the residual update from its heads' attention ``[n, heads, DL]``."""
        return attn.float().reshape(attn.shape[0], -1) @ self.w_o[layer][rank]

    def next_tokens(self, hidden: torch.Tensor) -> list[int]:
        """Greedy: the argmax token after each position."""
        return [int(t) for t in (_rms(hidden) @ self.w_out).argmax(-1)]

    def prefill(
        self, tokens: torch.Tensor, positions: torch.Tensor, scale: float, dtype: torch.dtype
    ) -> dict[int, torch.Tensor]:
        """The latents of a prompt (causal attention, plain torch: the extend forward is not the verify path under
        test): layer -> ``[n, D]`` in the pool's dtype, what each token leaves in the KV cache."""
        hidden = self.embed_tokens(tokens)
        n = tokens.shape[0]
        causal = torch.ones(n, n, dtype=torch.bool).tril()
        out: dict[int, torch.Tensor] = {}
        for layer in self.shape.layers:
            kv = self.latents(hidden, positions, layer).to(dtype)
            out[layer] = kv
            keys = kv.float()
            update = torch.zeros_like(hidden)
            for rank in range(self.shape.tp_size):
                q = self.queries(hidden, positions, layer, rank).to(dtype).float()
                scores = torch.einsum("thd,sd->ths", q, keys) * scale
                scores = scores.masked_fill(~causal[:, None, :], float("-inf"))
                attn = torch.einsum("ths,sd->thd", torch.softmax(scores, -1), keys[:, :DL]).to(dtype)
                update += self.attention_output(attn, layer, rank)
            hidden = hidden + update
        return out
