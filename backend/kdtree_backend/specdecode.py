"""Tree speculative decoding for the stand-in server: the tiny target model (:mod:`tinymodel`), the n-gram drafter
(:mod:`drafter`), and one verify step of SGLang's shape through the backend's real verify path.

A request's tokens live in a KV pool as SGLang keeps them (page size 1): the committed tokens' latents at rows of
the request (``req_to_token``), one pool tensor ``[rows, 1, 576]`` per layer. A verify step:

1. the drafter proposes a tree of ``q_len`` nodes (node 0: the context's last token, whose KV is not cached yet);
2. the tree's nodes get fresh rows (``out_cache_loc``) and SGLang's TARGET_VERIFY metadata is built: prefix-only
   ``kv_indptr``/``kv_indices``, the ``[q_len, prefix + q_len]`` ``custom_mask`` blocks, ``qo_indptr``;
3. per layer, the nodes' latents are saved to the pool first, then every rank's queries go through
   :meth:`ReplayService.verify_layer` (``marshal.py`` -> the kernel or reference attention; on sampled steps the
   independent dense attention and a parity line), and the ranks' outputs update the residual;
4. the target's greedy token after each node decides how far the tree is accepted (:func:`drafter.accept`); the
   rows of the root and the accepted nodes join the request, the others go back to the pool.

So the tokens come from the verify attention's output: a marshaling bug (the seed's) changes the answers and the
accepted drafts, not only the parity lines. A correct verify path gives the tokens of plain greedy decoding
whatever the drafter proposes; the drafter only decides how many come per step.

``common_mode``: the injected fault ``common-mode`` (docs/testbed.md): the verify metadata's ``sm_scale`` is made
from the latent's 576 dims without the YaRN mscale (0.04167 instead of 0.14468). The kernel path and the dense
reference both read it, so parity agrees with itself, and the answers change.
"""

from __future__ import annotations

import threading
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field, replace

import torch
from kdtree_kernel.mask import ancestor_mask

from .batch import DL, DR, VerifyBatch, mla_softmax_scale
from .drafter import DraftTree, accept, propose
from .replay import ReplayService
from .tinymodel import EMBED_ROWS, VOCAB, ModelShape, TinyModel
from .verify import VerifyMetadata, marshal_verify

CONTEXT_LEN = 8192  # longest prompt + max_new_tokens one request may ask for
# Every request's context starts with this many fixed tokens (the BOS and system prompt of a real model), so a
# verify step always has a prefix of at least q_len tokens: a verify path that leaves the drafts out of the keys
# (the seed's bug) then attends over wrong keys and changes the answers, as on a GPU host, instead of having fewer
# keys than drafts.
PREAMBLE_MIN = 16
POOL_ROWS = 4 * CONTEXT_LEN + 1  # row 0 is padding, never handed out


def verify_scale(common_mode: bool) -> float:
    """The verify metadata's ``sm_scale``: the layer's scaling, or the common-mode fault's wrong one."""
    if common_mode:
        return float((DL + DR) ** -0.5)  # the fault: qk_head_dim read as the latent's 576 dims, no YaRN mscale
    return mla_softmax_scale()


def compact(batch: VerifyBatch, layer: int) -> VerifyBatch:
    """``batch``'s layer ``layer`` with only the rows the step reads, renumbered from 1 (row 0 stays padding):
    the same keys, mask and queries for the dense check, without widening the whole pool to fp32 each time."""
    used = torch.cat([batch.kv_indices.long(), batch.out_cache_loc.long()])
    pool = batch.kv_buffers[layer]
    renumber = torch.zeros(pool.shape[0], dtype=torch.long, device=pool.device)
    renumber[used] = torch.arange(1, used.numel() + 1, device=pool.device)
    rows = torch.cat([pool[:1] * 0, pool[used]])
    return replace(
        batch,
        req_to_token=renumber[batch.req_to_token.long()].int(),
        kv_indices=renumber[batch.kv_indices.long()],
        out_cache_loc=renumber[batch.out_cache_loc.long()],
        kv_buffers={layer: rows},
        q={layer: batch.q[layer]},
    )


class ContextTooLong(ValueError):
    """A request that cannot fit the KV pool (answered 400)."""


class KvPool:
    """SGLang's token pool, one ``[rows, 1, D]`` tensor per layer, with a free list and reservations: a request
    reserves the rows it may ever need when it starts, so a running request never finds the pool full."""

    def __init__(self, layers: Sequence[int], rows: int, dtype: torch.dtype, device: torch.device) -> None:
        self.buffers = {layer: torch.zeros(rows, 1, DL + DR, dtype=dtype, device=device) for layer in layers}
        self.rows = rows
        self._free = list(range(rows - 1, 0, -1))  # pop() hands out 1, 2, 3, ...
        self._reserved = 0
        self._changed = threading.Condition()

    def reserve(self, count: int) -> None:
        """Wait until ``count`` rows can be promised to one request (others finishing free them)."""
        if count > self.rows - 1:
            raise ContextTooLong(f"needs {count} KV rows, the pool has {self.rows - 1}")
        with self._changed:
            self._changed.wait_for(lambda: self._reserved + count <= self.rows - 1)
            self._reserved += count

    def unreserve(self, count: int) -> None:
        with self._changed:
            self._reserved -= count
            self._changed.notify_all()

    def alloc(self, count: int) -> list[int]:
        with self._changed:
            if count > len(self._free):
                raise RuntimeError(f"KV pool exhausted: {count} rows wanted, {len(self._free)} free")
            return [self._free.pop() for _ in range(count)]

    def release(self, rows: Sequence[int]) -> None:
        with self._changed:
            self._free.extend(reversed(rows))

    @property
    def free_rows(self) -> int:
        return len(self._free)


@dataclass
class RequestState:
    """One running request: its context (prompt + generated tokens) and the pool rows of its cached tokens
    (every token but the last: ``len(rows) == len(tokens) - 1``)."""

    tokens: list[int]
    rows: list[int]
    reserved: int
    prompt_len: int
    verify_ct: int = 0
    accepted_drafts: int = 0
    step_tokens: list[int] = field(default_factory=list)  # new tokens per verify step

    @property
    def generated(self) -> list[int]:
        return self.tokens[self.prompt_len :]


class SpeculativeDecoder:
    """The model, the drafter and the pool; :meth:`step` is one verify step of some running requests."""

    def __init__(
        self,
        service: ReplayService,
        *,
        q_len: int,
        dtype: torch.dtype,
        seed: int = 0,
        common_mode: bool = False,
        pool_rows: int = POOL_ROWS,
    ) -> None:
        s = service.settings
        self.service = service
        self.q_len = q_len
        self.dtype = dtype
        self.layers = tuple(s.layers)
        self.model = TinyModel(ModelShape(heads=s.heads, layers=self.layers, tp_size=s.tp_size, seed=seed))
        table = self.model.draft_table().tolist()
        self.guess = lambda token: table[token % EMBED_ROWS]
        self.scale = verify_scale(common_mode)
        self.preamble = tuple((7919 * i + 1) % VOCAB for i in range(max(PREAMBLE_MIN, q_len)))
        self.pool = KvPool(self.layers, pool_rows, dtype, service.device)

    @staticmethod
    def check(prompt: Sequence[int], max_new_tokens: int) -> None:
        """Raise :class:`ContextTooLong` when the request cannot run here (SGLang answers such a request 400)."""
        if len(prompt) + max_new_tokens > CONTEXT_LEN:  # the preamble is the server's, not counted
            raise ContextTooLong(
                f"the prompt ({len(prompt)} tokens) plus max_new_tokens ({max_new_tokens}) exceeds this server's "
                f"context length of {CONTEXT_LEN} tokens"
            )

    def start(self, prompt: Sequence[int], max_new_tokens: int) -> RequestState:
        """Admit a request: reserve its rows (waits while the pool is promised to others), cache its prompt."""
        if not prompt:
            raise ValueError("a request needs at least one prompt token")
        self.check(prompt, max_new_tokens)
        context = [*self.preamble, *prompt]
        need = len(context) + max_new_tokens + 2 * self.q_len
        self.pool.reserve(need)
        state = RequestState(tokens=context, rows=[], reserved=need, prompt_len=len(context))
        cached = len(context) - 1
        if cached:
            rows = self.pool.alloc(cached)
            tokens = torch.tensor(context[:-1], dtype=torch.long)
            with torch.inference_mode():
                latents = self.model.prefill(tokens, torch.arange(cached), mla_softmax_scale(), self.dtype)
            where = torch.tensor(rows, dtype=torch.long, device=self.service.device)
            for layer, kv in latents.items():
                self.pool.buffers[layer][where, 0] = kv.to(self.service.device)
            state.rows = rows
        return state

    def finish(self, state: RequestState) -> None:
        """The request is done: its rows and its reservation go back to the pool."""
        self.pool.release(state.rows)
        state.rows = []
        self.pool.unreserve(state.reserved)
        state.reserved = 0

    def step(self, states: Sequence[RequestState], index: int, parity_layers: Collection[int]) -> None:
        """Verify step ``index`` (the server's global count, for capture) of ``states`` as one batch: each gains
        its accepted drafts and the bonus token (appended to ``tokens``; the caller truncates at max_new_tokens)."""
        q_len = self.q_len
        trees = [propose(state.tokens, q_len, self.guess) for state in states]
        bs = len(states)
        draft_rows = self.pool.alloc(bs * q_len)
        try:
            target = self._verify(states, trees, draft_rows, index, parity_layers)
        except BaseException:
            self.pool.release(draft_rows)  # a failed step leaves the requests as they were
            raise
        for b, (state, tree) in enumerate(zip(states, trees, strict=True)):
            mine = draft_rows[b * q_len : (b + 1) * q_len]
            result = accept(tree, target[b * q_len : (b + 1) * q_len])
            kept = {0, *result.path}
            state.rows.extend(mine[node] for node in (0, *result.path))
            self.pool.release([row for node, row in enumerate(mine) if node not in kept])
            state.tokens.extend(result.tokens)
            state.verify_ct += 1
            state.accepted_drafts += result.drafts
            state.step_tokens.append(len(result.tokens))
        self.service.outcome.steps_done += 1

    def _verify(
        self,
        states: Sequence[RequestState],
        trees: Sequence[DraftTree],
        draft_rows: Sequence[int],
        index: int,
        parity_layers: Collection[int],
    ) -> list[int]:
        """The model's forward over the trees' nodes, attention through the verify path: the target's greedy
        token after each node (request-major, ``q_len`` per request)."""
        device = self.service.device
        batches, meta, positions, tokens = self._metadata(states, trees, draft_rows)
        capturing = [
            self.service.begin_capture(index, ident, batches[ident.tp], meta) for ident in self.service.identities
        ]
        hidden = self.model.embed_tokens(tokens)
        where = batches[0].out_cache_loc
        for layer in self.layers:
            self.pool.buffers[layer][where, 0] = self.model.latents(hidden, positions, layer).to(self.dtype).to(device)
            update = torch.zeros_like(hidden)
            for identity in self.service.identities:
                batch = batches[identity.tp]
                q = self.model.queries(hidden, positions, layer, identity.tp)
                batch.q[layer] = q.to(self.dtype).to(device)
                parity = layer in parity_layers
                out = self.service.verify_layer(
                    identity, batch, meta, layer, parity=parity, capturing=capturing[identity.tp],
                    reference=compact(batch, layer) if parity else None,
                )  # fmt: skip
                update += self.model.attention_output(out.cpu(), layer, identity.tp)
            hidden = hidden + update
        return self.model.next_tokens(hidden)

    def _metadata(
        self, states: Sequence[RequestState], trees: Sequence[DraftTree], draft_rows: Sequence[int]
    ) -> tuple[list[VerifyBatch], VerifyMetadata, torch.Tensor, torch.Tensor]:
        """SGLang's TARGET_VERIFY metadata of the step (one VerifyBatch per rank: same metadata and pool, the
        rank's own queries), the marshaled kernel inputs, and the nodes' positions and tokens."""
        q_len, device, bs = self.q_len, self.service.device, len(states)
        prefix_lens = [len(state.rows) for state in states]
        req_to_token = torch.zeros(bs, max(prefix_lens) + q_len, dtype=torch.int32)
        blocks, positions, tokens = [], [], []
        for b, (state, tree) in enumerate(zip(states, trees, strict=True)):
            plen = prefix_lens[b]
            req_to_token[b, :plen] = torch.tensor(state.rows, dtype=torch.int32)
            req_to_token[b, plen : plen + q_len] = torch.tensor(draft_rows[b * q_len : (b + 1) * q_len])
            block = torch.ones(q_len, plen + q_len, dtype=torch.bool)
            block[:, plen:] = ancestor_mask(list(tree.parents))
            blocks.append(block.reshape(-1))
            positions += [plen + depth for depth in tree.depths()]
            tokens += tree.tokens
        seq_lens = torch.tensor(prefix_lens, dtype=torch.long)
        kv_indptr = torch.zeros(bs + 1, dtype=torch.int32)
        kv_indptr[1:] = torch.cumsum(seq_lens, 0).int()
        kv_indices = torch.tensor([row for state in states for row in state.rows], dtype=torch.long)
        mask_indptr = torch.zeros(bs + 1, dtype=torch.long)
        mask_indptr[1:] = torch.cumsum(q_len * (seq_lens + q_len), 0)
        common = {
            "seq_lens": seq_lens.to(device),
            "req_pool_indices": torch.arange(bs, dtype=torch.long, device=device),
            "req_to_token": req_to_token.to(device),
            "kv_indptr": kv_indptr.to(device),
            "kv_indices": kv_indices.to(device),
            "out_cache_loc": torch.tensor(draft_rows, dtype=torch.long, device=device),
            "qo_indptr": torch.arange(0, (bs + 1) * q_len, q_len, dtype=torch.int32, device=device),
            "custom_mask": torch.cat(blocks).to(device),
            "mask_indptr": mask_indptr.to(device),
        }
        meta = marshal_verify(
            common["kv_indptr"], common["kv_indices"], common["out_cache_loc"], common["custom_mask"],
            common["mask_indptr"], q_len,
        )  # fmt: skip
        parents = [list(tree.parents) for tree in trees]
        heads = self.service.settings.heads
        batches = [
            VerifyBatch(
                bs=bs,
                q_len=q_len,
                heads=heads,
                layers=self.layers,
                sm_scale=self.scale,
                kv_buffers=self.pool.buffers,
                q={},
                parents=parents,
                **common,
            )  # type: ignore[arg-type]
            for _ in self.service.identities
        ]
        return batches, meta, torch.tensor(positions, dtype=torch.long), torch.tensor(tokens, dtype=torch.long)
