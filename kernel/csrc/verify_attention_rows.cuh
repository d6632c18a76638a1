// Writes both verify kernels make for rows that read no key: a malformed request's output, and the workspace slots
// of a chunk past a request's keys. Plain CUDA, no torch.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "verify_attention.h"

namespace kdtree {

// A malformed request (request_keys == 0) in a single-chunk launch: rows row0 .. row0 + block_rows - 1 of the
// request whose first query token is q_tok0 (those rows that exist) get zeros and LSE -inf, by the block's
// `threads` threads.
__device__ __forceinline__ void write_empty_rows(const VerifyParams& p, int q_tok0, int row0, int block_rows, int tid,
                                                 int threads) {
  const int rows = p.q_len * p.heads;
  const int64_t out_row0 = static_cast<int64_t>(q_tok0) * p.heads;
  constexpr int kPieces = kValueDim / 8;  // 16-byte pieces of an output row
  for (int i = tid; i < block_rows * kPieces; i += threads) {
    const int r = row0 + i / kPieces;
    if (r >= rows) continue;
    __nv_bfloat16* out = static_cast<__nv_bfloat16*>(p.out) + (out_row0 + r) * kValueDim;
    reinterpret_cast<uint4*>(out)[i % kPieces] = make_uint4(0u, 0u, 0u, 0u);
  }
  const int r = row0 + tid;
  if (p.lse != nullptr && tid < block_rows && r < rows) p.lse[out_row0 + r] = -INFINITY;
}

// A chunk with no key of request b (past its keys, or any chunk of a malformed request) in a split launch: its
// rows' partial LSEs become -inf, so the combine kernel, which reads every chunk slot of the grid and not the
// request's sizes, gives the chunk weight 0 and skips its (stale) partial rows. The first block_rows threads.
__device__ __forceinline__ void mark_chunk_empty(const VerifyParams& p, int b, int split, int row0, int block_rows,
                                                 int tid) {
  const int rows = p.q_len * p.heads;
  const int r = row0 + tid;
  if (tid < block_rows && r < rows) p.part_lse[(static_cast<int64_t>(b) * p.splits + split) * rows + r] = -INFINITY;
}

}  // namespace kdtree
