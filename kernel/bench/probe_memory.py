"""Diagnostic: how fast can the KV rows of a verify batch be read, and how close does the kernel get?

Times, on one large batch (default bs 64 x 8192 keys): a contiguous copy of the pool, a gather of the batch's
random pool rows (torch index_select), the same gather with each request's rows sorted, and the verify kernel
for several (q_len, heads) shapes with its rows as a random permutation of the pool, contiguous, or in runs of
64. Prints one JSON line per measurement.

    python3 kernel/bench/probe_memory.py --bs 64 --prefix 8192
"""

from __future__ import annotations

import argparse
import itertools
import json

import torch
from kdtree_kernel.testing import make_case

SM_SCALE = 0.14468


def time_us(fn, reps: int = 20) -> float:
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(reps):
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    times.sort()
    return times[len(times) // 2]


def sorted_per_request(indices: torch.Tensor, indptr: torch.Tensor, q_len: int) -> torch.Tensor:
    out = indices.clone()
    bounds = indptr.tolist()
    for lo, hi in itertools.pairwise(bounds):
        out[lo : hi - q_len] = torch.sort(indices[lo : hi - q_len]).values
    return out


def reordered(indices: torch.Tensor, order: str) -> torch.Tensor:
    """The same number of pool rows in another layout: as made (a random permutation of the whole pool),
    contiguous (request after request), or runs of 64 consecutive rows placed at random."""
    if order == "random":
        return indices
    n = indices.numel()
    if order == "contiguous":
        return torch.arange(n, device=indices.device, dtype=indices.dtype)
    runs = torch.randperm((n + 63) // 64, device=indices.device)
    rows = (runs[:, None] * 64 + torch.arange(64, device=indices.device)[None, :]).reshape(-1)[:n]
    return rows.clamp_max(n - 1).to(indices.dtype)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--bs", type=int, default=64)
    parser.add_argument("--prefix", type=int, default=8192)
    args = parser.parse_args()
    base = make_case(args.bs, args.prefix, 9, 8)
    pool = base.kv_buffer.view(-1, 576)
    nbytes = base.kv_tokens * 576 * 2
    idx = base.kv_indices.long()
    sorted_idx = sorted_per_request(base.kv_indices, base.kv_indptr, 9).long()
    dst = torch.empty(idx.numel(), 576, dtype=pool.dtype, device=pool.device)
    copy_src = pool[: idx.numel()]
    rows = [
        ("copy_contiguous", lambda: dst.copy_(copy_src)),
        ("gather_random", lambda: torch.index_select(pool, 0, idx, out=dst)),
        ("gather_sorted", lambda: torch.index_select(pool, 0, sorted_idx, out=dst)),
    ]
    for name, fn in rows:
        us = time_us(fn)
        print(json.dumps({"what": name, "us": round(us, 1), "GBps": round(2 * nbytes / us / 1e3)}), flush=True)
    for q_len, heads in ((1, 8), (9, 8), (32, 8)):
        case = make_case(args.bs, args.prefix, q_len, heads)
        out = torch.empty(case.q.shape[0], heads, 512, dtype=case.q.dtype, device=case.q.device)
        for order in ("random", "contiguous", "runs64"):
            indices = reordered(case.kv_indices, order)

            def call(indices: torch.Tensor = indices, case=case, out=out) -> None:
                case.run_kernel(SM_SCALE, kv_indices=indices, out=out)

            us = time_us(call)
            kv_bytes = case.kv_tokens * 576 * 2
            print(
                json.dumps(
                    {
                        "what": f"kernel q{q_len} H{heads} {order}",
                        "us": round(us, 1),
                        "kv_GBps": round(kv_bytes / us / 1e3),
                    }
                ),
                flush=True,
            )
        del case, out
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
