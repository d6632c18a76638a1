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
// Shared-memory KV stages (16-key tiles) of a block of row_groups x 16 rows, within sm_120's 99 KB per block (sm_90
// runs the same): the smaller blocks stream keys near the copy rate, where one more tile in flight pays; the 48-row
// block's step is not bound by memory latency (docs/kernel-notes.md, "The launch constants").
constexpr int stages_for(int row_groups) { return row_groups <= 2 ? 5 : 4; }
// The fp8 path rounds Q * 2^-kFp8QShift to fp16 (range; verify_attention_kernel.cuh); the softmax scale undoes it.
constexpr int kFp8QShift = 8;

struct VerifyParams {
  const void* q;              // bf16 [T, H, 576], last dim contiguous
  int64_t q_stride_token;     // elements between tokens
  int64_t q_stride_head;      // elements between heads
  const void* kv;             // bf16 or fp8 e4m3 pool rows, last dim contiguous
  int64_t kv_row_stride;      // elements (= bytes for fp8) between pool rows
  const int32_t* kv_indptr;   // [bs + 1]
  const void* kv_indices;     // int32 or int64 [nnz]: per request prefix rows then its q_len draft rows
  int64_t kv_index_count;     // nnz: a request whose keys would lie outside kv_indices reads none (request_keys)
  int indices_are_int64;
  int kv_fp8;                 // 1: the pool is float8_e4m3fn (SGLang --kv-cache-dtype fp8_e4m3), keys = pool * k_scale
  const int32_t* qo_indptr;   // [bs + 1]
  const uint64_t* draft_mask; // [T, mask_words]
  int mask_words;
  void* out;                  // bf16 [T, H, 512], contiguous
  float* lse;                 // float [T, H] (natural log) or nullptr
  void* part_o;               // workspace, used when splits > 1: bf16 [bs, splits, rows, 512], normalised per chunk
  float* part_lse;            // workspace, after part_o: float [bs, splits, rows] (log2 domain)
  int bs;
  int heads;
  int q_len;
  int row_groups;             // 1..3: 16-row groups per block
  int row_blocks;             // blocks along the (token, head) rows of one request
  int splits;                 // KV chunks per request (grid dimension, fixed at capture)
  int chunk_keys;             // keys per chunk, a multiple of kChunkAlign; 0: per request (see chunk_for)
  int split_schedulers;       // 1: the RG = 3 block's split warp layout (long chunks; kdtree_kernel.plan)
  float scale_log2;           // sm_scale * k_scale * log2(e) (the fp8 path also folds its Q prescale in)
  float out_scale;            // v_scale: the pool's values are stored divided by it (1 for a plain bf16 pool)
};

// Bytes of one chunk partial of one row in the workspace: its 512 normalised output values in bf16 (half the bytes
// of fp32 to write and read back; its rounding is at most the output's own) and its LSE (docs/kernel-notes.md).
constexpr int kPartialRowBytes = kValueDim * 2 + 4;

// Keys of request b, or 0 when its kv_indptr entries are malformed: fewer keys than q_len (the drafts must be
// among them), a negative start, or an end past kv_indices. The kernels read nothing of such a request and
// write zeros (LSE -inf) for its rows, so a bad batch replayed in a CUDA graph cannot read another request's
// keys or past the index list; outside capture the op refuses it before launching (kdtree_kernel.inputs).
__host__ __device__ inline int request_keys(const VerifyParams& p, int b) {
  const int begin = p.kv_indptr[b];
  const int end = p.kv_indptr[b + 1];
  if (begin < 0 || end < begin || static_cast<int64_t>(end) > p.kv_index_count || end - begin < p.q_len) return 0;
  return end - begin;
}

// Keys per KV chunk of a request with kv_len keys. A fixed chunk (planned for the worst-case prefix) or, with
// chunk_keys == 0, kv_len spread over all `splits` chunks, so that a short request under a CUDA graph
// captured for a long bound still uses the whole grid. A request longer than the planned bound (a graph
// replayed with a prefix past the max_prefix_len it was captured for) is spread the same way: the grid's
// chunks then still cover every key, where fixed chunks would silently leave the last keys out of the
// softmax. Host and device agree through this one function.
__host__ __device__ inline int chunk_for(const VerifyParams& p, int kv_len) {
  if (p.chunk_keys > 0 && static_cast<int64_t>(p.chunk_keys) * p.splits >= kv_len) return p.chunk_keys;
  const int even = (kv_len + p.splits - 1) / p.splits;
  const int aligned = (even + kChunkAlign - 1) / kChunkAlign * kChunkAlign;
  return aligned > kChunkAlign ? aligned : kChunkAlign;
}

// Shared memory (bytes, dynamic) one block of the main kernel uses; 0 if unsupported.
int verify_smem_bytes(int row_groups, bool fp8 = false);

// Resident blocks per SM of the main kernel (occupancy API; host only, no stream work).
int verify_blocks_per_sm(int row_groups, bool fp8 = false);

// Enqueues the main kernel (and the combine kernel when splits > 1) on `stream`. No allocation, no sync.
cudaError_t launch_verify_attention(const VerifyParams& p, cudaStream_t stream);

}  // namespace kdtree
