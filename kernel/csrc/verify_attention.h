// Host-visible contract of the DDTree verify-attention kernels: launch parameters and entry points.
// No torch and no device code here, so both the torch binding (C++) and the kernel unit (CUDA) include it.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace kdtree {

// Absorbed MLA geometry (DeepSeek / Kimi K2.6): keys are 512 latent + 64 rope dims, values the latent part.
constexpr int kHeadDim = 576;
constexpr int kValueDim = 512;
// KV chunks are multiples of this many keys (two 16-key tiles); the widest supported draft block is two
// 64-bit mask words per query.
constexpr int kChunkAlign = 32;
constexpr int kMaxQLen = 128;
constexpr int kMaxRowGroups = 3;  // a block serves up to 3 x 16 (token, head) rows of one request
// Shared-memory KV stages (16-key tiles): fits sm_120's 99 KB per block. sm_90 runs the same: 8 stages, and
// 32-key tiles, both measured within 2% of this on the H200 (kernel/bench/results-h200.md).
constexpr int kStages = 4;

struct VerifyParams {
  const void* q;              // bf16 [T, H, 576], last dim contiguous
  int64_t q_stride_token;     // elements between tokens
  int64_t q_stride_head;      // elements between heads
  const void* kv;             // bf16 pool rows, last dim contiguous
  int64_t kv_row_stride;      // elements between pool rows
  const int32_t* kv_indptr;   // [bs + 1]
  const void* kv_indices;     // int32 or int64 [nnz]: per request prefix rows then its q_len draft rows
  int indices_are_int64;
  const int32_t* qo_indptr;   // [bs + 1]
  const uint64_t* draft_mask; // [T, mask_words]
  int mask_words;
  void* out;                  // bf16 [T, H, 512], contiguous
  float* lse;                 // float [T, H] (natural log) or nullptr
  float* part_o;              // workspace, used when splits > 1: float [bs, splits, rows, 512]
  float* part_lse;            // workspace, used when splits > 1: float [bs, splits, rows] (log2 domain)
  int bs;
  int heads;
  int q_len;
  int row_groups;             // 1..3: 16-row groups per block
  int row_blocks;             // blocks along the (token, head) rows of one request
  int splits;                 // KV chunks per request (grid dimension, fixed at capture)
  int chunk_keys;             // keys per chunk, a multiple of kChunkAlign; 0: per request (see chunk_for)
  int split_schedulers;       // 1: the RG = 3 block's split warp layout (long chunks; kdtree_kernel.plan)
  float scale_log2;           // sm_scale * log2(e)
};

// Keys per KV chunk of a request with kv_len keys. A fixed chunk (planned for the worst-case prefix) or, with
// chunk_keys == 0, kv_len spread over all `splits` chunks, so that a short request under a CUDA graph
// captured for a long bound still uses the whole grid. Host and device agree through this one function.
__host__ __device__ inline int chunk_for(const VerifyParams& p, int kv_len) {
  if (p.chunk_keys > 0) return p.chunk_keys;
  const int even = (kv_len + p.splits - 1) / p.splits;
  const int aligned = (even + kChunkAlign - 1) / kChunkAlign * kChunkAlign;
  return aligned > kChunkAlign ? aligned : kChunkAlign;
}

// Shared memory (bytes, dynamic) one block of the main kernel uses; 0 if unsupported.
int verify_smem_bytes(int row_groups);

// Resident blocks per SM of the main kernel (occupancy API; host only, no stream work).
int verify_blocks_per_sm(int row_groups);

// Enqueues the main kernel (and the combine kernel when splits > 1) on `stream`. No allocation, no sync.
cudaError_t launch_verify_attention(const VerifyParams& p, cudaStream_t stream);

}  // namespace kdtree
