// Launch logic and the combine kernel. Torch-free: CI compiles the kernel units alone with nvcc for sm_120a
// and sm_90a (tests/kernel/test_compile.py), and the torch extension links the same objects.
#include <cuda_runtime.h>

#include <cstdlib>
#include <cstring>

#include "verify_attention.h"
#include "verify_attention_fp8mma.cuh"
#include "verify_attention_kernel.cuh"
#include "verify_attention_tiles.h"

namespace kdtree {
namespace {

// The fp8 tensor-core kernel's form on the current device: e4m3 mma.sync where the hardware has it (sm_89,
// sm_120: QMMA), fp16 mma.sync on widened fragments on sm_90 (its e4m3 mma.sync is two HMMA plus conversions).
// KDTREE_FP8_MMA=qmma|hmma overrides (A/B timing). Host only, no stream work (safe under graph capture).
bool fp8_qmma() {
  const char* env = std::getenv("KDTREE_FP8_MMA");
  if (env != nullptr && std::strcmp(env, "qmma") == 0) return true;
  if (env != nullptr && std::strcmp(env, "hmma") == 0) return false;
  int device = 0;
  int major = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return true;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess) return true;
  return major != 9;
}

// Programmatic dependent launch (sm_90 and later; griddep_* in mma_primitives.cuh). The main kernel launches as a
// programmatic dependent of whatever the stream ran before it (its blocks are placed as that kernel's last blocks
// leave, and wait for it before reading anything), and the combine kernel as one of the main kernel (which signals
// once its blocks leave the KV loop; the combine's blocks wait in griddep_wait until the main kernel has finished
// and its writes are visible). It shortens small batches' calls and leaves large ones as they were
// (docs/kernel-notes.md, "The launch constants").
// KDTREE_PDL=none|main|combine picks plain launches or one of the two (A/B timing); anything else, or no
// setting, both. Host only, no stream work (safe under graph capture).
enum class PdlUse { kNone, kMain, kCombine, kAll };

PdlUse pdl_use() {
  const char* env = std::getenv("KDTREE_PDL");
  if (env == nullptr) return PdlUse::kAll;
  if (std::strcmp(env, "none") == 0) return PdlUse::kNone;
  if (std::strcmp(env, "main") == 0) return PdlUse::kMain;
  if (std::strcmp(env, "combine") == 0) return PdlUse::kCombine;
  return PdlUse::kAll;
}

// Launches `kernel` with `grid` x `block` on `stream`, as a programmatic dependent of the stream's previous
// kernel when `dependent`.
template <typename Kernel>
cudaError_t launch_kernel(Kernel kernel, dim3 grid, dim3 block, int smem, cudaStream_t stream, bool dependent,
                          const VerifyParams& p) {
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = static_cast<size_t>(smem);
  config.stream = stream;
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[0].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attribute;
  config.numAttrs = dependent ? 1 : 0;
  return cudaLaunchKernelEx(&config, kernel, p);
}

VerifyKernelFn kernel_for(int row_groups, bool int64_indices, bool split_schedulers, bool fp8) {
  const bool qmma = fp8 && row_groups == 1 && fp8_qmma();
  return int64_indices ? verify_kernel_i64(row_groups, split_schedulers, fp8, qmma)
                       : verify_kernel_i32(row_groups, split_schedulers, fp8, qmma);
}

int threads_for(int row_groups, bool split_schedulers, bool fp8) {
  switch (row_groups) {
    case 1:  // fp8: the e4m3 tensor-core kernel
      return fp8 ? fp8mma::kThreads : launch_threads<1, false>();
    case 2:
      return launch_threads<2, false>();
    default:
      return split_schedulers ? launch_threads<3, true>() : launch_threads<3, false>();
  }
}

}  // namespace

// Combine kernel shape: one block per (row, request, column part) of up to 512 threads in groups; a group covers
// the part's columns (8 bf16 output columns a thread, one 16-byte load per chunk) and takes every groups-th batch
// of up to kCombineBatch chunks, with the batch's loads in flight together (one chunk in flight at a time made
// the combine the larger part of a bs = 1 call). Idle groups cost large batches with 2-4 chunks, hence one group
// per 8 chunks. Past 128 chunks (bs = 1 with one row block) a batch of at most 32 rows in all splits each row into
// 4 column parts of 16 threads a group, so that all of a row's chunks are in flight in one round instead of three
// or four dependent L2 round trips, over at most 128 blocks (one per SM, by registers: one wave on both GPUs).
// More rows, or 65-128 chunks (column parts would exceed one wave), keep whole rows; 33-96 chunks take 12 groups
// of 768 threads (one round of loads), 97-128 chunks two rounds of 8 groups (docs/kernel-notes.md, "The launch
// constants").
constexpr int kCombineColsPerThread = 8;
constexpr int kCombineThreads = kValueDim / kCombineColsPerThread;  // threads covering a whole row (64)
constexpr int kCombineBatch = 8;  // the widest batch
constexpr int kCombineMaxThreads = 768;
constexpr int kCombinePartedRows = 32;  // the most rows (of the whole batch) whose combine runs in column parts

// A running LSE-weighted sum of chunk partials: weights 2^(lse_s - max), rescaled whenever the maximum grows.
struct CombineState {
  float max_lse = -INFINITY;  // log2 domain; -INFINITY while no chunk with a visible key has been added
  float total = 0.f;
  float acc[kCombineColsPerThread] = {};

  // Moves the reference maximum to max(max_lse, other_max), scaling this state's sums; returns the factor for
  // sums taken against other_max.
  __device__ __forceinline__ float raise_max(float other_max) {
    const float new_max = fmaxf(max_lse, other_max);
    const float base = new_max == -INFINITY ? 0.f : new_max;  // nothing visible yet: all weights stay 0
    const float own = exp2f(max_lse - base);
    total *= own;
#pragma unroll
    for (int k = 0; k < kCombineColsPerThread; ++k) acc[k] *= own;
    max_lse = new_max;
    return exp2f(other_max - base);
  }

  // Adds `weight` times one 16-byte piece of a partial row (8 bf16 values).
  __device__ __forceinline__ void add(float weight, const uint4& bf16x8) {
    const uint32_t words[4] = {bf16x8.x, bf16x8.y, bf16x8.z, bf16x8.w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const float2 v = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&words[k]));
      acc[2 * k] += weight * v.x;
      acc[2 * k + 1] += weight * v.y;
    }
  }
};

// Merges the chunk partials of one (request, row): out = sum_s w_s O_s / sum_s w_s with w_s = 2^(lse_s - max lse).
// One pass: each batch's LSEs and partial rows load together, and the running maximum rescales the sums (the
// previous form read every LSE first, one more dependent L2 round trip). It launches as a programmatic dependent of
// the main kernel (pdl_use): everything up to griddep_wait (the output row's index) then overlaps the main kernel's
// last blocks.
template <int kGroups, int kBatch, int kParts>
__global__ void __launch_bounds__(kCombineThreads / kParts * kGroups) verify_combine_kernel(const VerifyParams p) {
  constexpr int kGroupThreads = kCombineThreads / kParts;
  __shared__ float group_acc[kGroups > 1 ? kGroups - 1 : 1][kCombineColsPerThread][kGroupThreads];
  __shared__ float group_total[kGroups > 1 ? kGroups - 1 : 1];
  __shared__ float group_max[kGroups > 1 ? kGroups - 1 : 1];
  const int r = blockIdx.x;
  const int b = blockIdx.y;
  const int part_col = threadIdx.x % kGroupThreads;
  const int col = blockIdx.z * kGroupThreads + part_col;  // 16-byte piece of the row
  const int group = threadIdx.x / kGroupThreads;
  const int rows = p.q_len * p.heads;
  const int64_t slot0 = static_cast<int64_t>(b) * p.splits * rows + r;
  const int64_t out_row = static_cast<int64_t>(p.qo_indptr[b]) * p.heads + r;
  const uint4* part_o = static_cast<const uint4*>(p.part_o);  // 64 x 16 bytes per partial row
  griddep_wait();  // the main kernel's partials are complete and visible from here on

  // Every chunk slot of the grid was written by this launch's main kernel: a chunk past the request's keys (or every
  // chunk of a malformed request) has LSE -inf and a stale partial row, which weighs 0 and is skipped. So the merge
  // needs none of the request's sizes, whose kv_indptr load put one more dependent L2 round trip in front of it.
  CombineState st;
  for (int s0 = group * kBatch; s0 < p.splits; s0 += kGroups * kBatch) {
    float lse[kBatch];
    uint4 o[kBatch];
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      const int64_t slot = slot0 + static_cast<int64_t>(s0 + j) * rows;
      const bool in_grid = s0 + j < p.splits;
      lse[j] = in_grid ? p.part_lse[slot] : -INFINITY;
      o[j] = in_grid ? part_o[slot * kCombineThreads + col] : make_uint4(0u, 0u, 0u, 0u);
    }
    float batch_max = lse[0];
#pragma unroll
    for (int j = 1; j < kBatch; ++j) batch_max = fmaxf(batch_max, lse[j]);
    st.raise_max(batch_max);
    const float base = st.max_lse == -INFINITY ? 0.f : st.max_lse;
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      const float w = exp2f(lse[j] - base);
      st.total += w;
      if (w > 0.f) st.add(w, o[j]);  // a stale row (weight 0) may hold anything, NaN included
    }
  }
  if (group > 0) {
#pragma unroll
    for (int k = 0; k < kCombineColsPerThread; ++k) group_acc[group - 1][k][part_col] = st.acc[k];
    if (part_col == 0) {
      group_total[group - 1] = st.total;
      group_max[group - 1] = st.max_lse;
    }
  }
  __syncthreads();
  if (group > 0) return;
  // The groups' maxima first, then their sums against it: independent terms, no chain of rescales.
  float all_max = st.max_lse;
#pragma unroll
  for (int g = 0; g < kGroups - 1; ++g) all_max = fmaxf(all_max, group_max[g]);
  st.raise_max(all_max);
  const float base = st.max_lse == -INFINITY ? 0.f : st.max_lse;
#pragma unroll
  for (int g = 0; g < kGroups - 1; ++g) {
    const float w = exp2f(group_max[g] - base);
#pragma unroll
    for (int k = 0; k < kCombineColsPerThread; ++k) st.acc[k] += w * group_acc[g][k][part_col];
    st.total += w * group_total[g];
  }
  const float inv = st.total > 0.f ? 1.f / st.total : 0.f;
  uint4 packed;
  packed.x = pack_bf16x2(st.acc[0] * inv, st.acc[1] * inv);
  packed.y = pack_bf16x2(st.acc[2] * inv, st.acc[3] * inv);
  packed.z = pack_bf16x2(st.acc[4] * inv, st.acc[5] * inv);
  packed.w = pack_bf16x2(st.acc[6] * inv, st.acc[7] * inv);
  reinterpret_cast<uint4*>(static_cast<__nv_bfloat16*>(p.out) + out_row * kValueDim)[col] = packed;
  if (p.lse != nullptr && col == 0) {  // part 0's first thread
    p.lse[out_row] = st.total > 0.f ? (st.max_lse + __log2f(st.total)) * kLn2 : -INFINITY;
  }
}

// Launches one combine kernel form (a programmatic dependent of the main kernel, pdl_use).
template <int kGroups, int kBatch, int kParts = 1>
cudaError_t launch_combine(const VerifyParams& p, cudaStream_t stream) {
  static_assert(kCombineThreads / kParts * kGroups <= kCombineMaxThreads, "one block");
  return launch_kernel(verify_combine_kernel<kGroups, kBatch, kParts>, dim3(p.q_len * p.heads, p.bs, kParts),
                       dim3(kCombineThreads / kParts * kGroups), 0, stream,
                       pdl_use() == PdlUse::kCombine || pdl_use() == PdlUse::kAll, p);
}

int verify_smem_bytes(int row_groups, bool fp8) {
  switch (row_groups) {
    case 1:
      return fp8 ? fp8mma::kSmemBytes : TileConfig<1, stages_for(1)>::kSmemBytes;
    case 2:
      return fp8 ? TileConfig<2, stages_for(2), true>::kSmemBytes : TileConfig<2, stages_for(2)>::kSmemBytes;
    case 3:
      return fp8 ? TileConfig<3, stages_for(3), true>::kSmemBytes : TileConfig<3, stages_for(3)>::kSmemBytes;
    default:
      return 0;
  }
}

int verify_blocks_per_sm(int row_groups, bool fp8) {
  VerifyKernelFn fn = kernel_for(row_groups, false, false, fp8);  // bf16 / fp8 widening: one block per SM
  if (fn == nullptr) return 0;
  const int smem = verify_smem_bytes(row_groups, fp8);
  if (cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, smem) != cudaSuccess) return 0;
  int blocks = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, fn, threads_for(row_groups, false, fp8), smem) != cudaSuccess) {
    return 0;
  }
  return blocks;
}

cudaError_t launch_verify_attention(const VerifyParams& p, cudaStream_t stream) {
  if (p.row_groups < 1 || p.row_groups > kMaxRowGroups || p.q_len < 1 || p.q_len > kMaxQLen || p.bs < 1 ||
      p.splits < 1 || p.chunk_keys < 0 || p.chunk_keys % kChunkAlign != 0 || p.row_blocks < 1) {
    return cudaErrorInvalidValue;
  }
  const bool split = p.split_schedulers != 0;
  VerifyKernelFn fn = kernel_for(p.row_groups, p.indices_are_int64 != 0, split, p.kv_fp8 != 0);
  if (fn == nullptr) return cudaErrorInvalidValue;
  const int smem = verify_smem_bytes(p.row_groups, p.kv_fp8 != 0);
  cudaError_t err = cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (err != cudaSuccess) return err;
  err = launch_kernel(fn, dim3(p.row_blocks, p.splits, p.bs), dim3(threads_for(p.row_groups, split, p.kv_fp8 != 0)),
                      smem, stream, pdl_use() == PdlUse::kMain || pdl_use() == PdlUse::kAll, p);
  if (err != cudaSuccess || p.splits == 1) return err;
  // Few chunks (large batches): one group, a batch no wider than the chunks (registers, hence occupancy, of a
  // memory-bound pass). Many (small batches): a group per 8 chunks, up to 12 groups.
  if (p.splits <= 2) {
    err = launch_combine<1, 2>(p, stream);
  } else if (p.splits <= 4) {
    err = launch_combine<1, 4>(p, stream);
  } else if (p.splits <= kCombineBatch) {
    err = launch_combine<1, kCombineBatch>(p, stream);
  } else if (p.splits <= 2 * kCombineBatch) {
    err = launch_combine<2, kCombineBatch>(p, stream);
  } else if (p.splits <= 4 * kCombineBatch) {
    err = launch_combine<4, kCombineBatch>(p, stream);
  } else if (p.splits <= 12 * kCombineBatch) {
    err = launch_combine<12, kCombineBatch>(p, stream);  // one round
  } else if (p.splits <= 16 * kCombineBatch || p.bs * p.q_len * p.heads > kCombinePartedRows) {
    err = launch_combine<8, kCombineBatch>(p, stream);  // two or more rounds (see above)
  } else {
    err = launch_combine<32, kCombineBatch, 4>(p, stream);  // up to 256 chunks (plan.MAX_SPLITS) in one round
  }
  return err;
}

}  // namespace kdtree
