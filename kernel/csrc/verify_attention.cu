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

// Combine kernel shape: one block per (row, request) of 1, 2 or 4 groups of 128 threads (one float4 of the 512
// output columns each); group j takes every groups-th batch of up to kCombineBatch chunks, with the batch's loads
// in flight together. A loop with one chunk in flight at a time cost ~0.28 us per chunk on the H200 (L2 round
// trips), which made the combine the larger part of a bs = 1 call; idle groups, on the other hand, cost up to 13%
// on large batches with 2-4 chunks (kernel/bench/splits-h200.md), hence one group per 8 chunks, up to 4.
constexpr int kCombineCols = kValueDim / 4;
constexpr int kCombineBatch = 8;  // the widest batch

// Merges the chunk partials of one (request, row): out = sum_s w_s O_s / sum_s w_s with w_s = 2^(lse_s - max lse).
template <int kGroups, int kBatch>
__global__ void __launch_bounds__(kCombineCols * kGroups) verify_combine_kernel(const VerifyParams p) {
  constexpr int kThreads = kCombineCols * kGroups;
  __shared__ float warp_max[kThreads / 32];
  __shared__ float4 group_acc[kGroups > 1 ? kGroups - 1 : 1][kCombineCols];
  __shared__ float group_total[kGroups > 1 ? kGroups - 1 : 1];
  const int r = blockIdx.x;
  const int b = blockIdx.y;
  const int col = threadIdx.x % kCombineCols;
  const int group = threadIdx.x / kCombineCols;
  const int rows = p.q_len * p.heads;
  const int kv_len = request_keys(p, b);  // 0 (no live chunk: zeros, LSE -inf) for a malformed request
  const int chunk = chunk_for(p, kv_len);
  const int live_splits = min(p.splits, (kv_len + chunk - 1) / chunk);
  const int64_t slot0 = static_cast<int64_t>(b) * p.splits * rows + r;

  float mx = -INFINITY;
  for (int s = threadIdx.x; s < live_splits; s += kThreads) {
    mx = fmaxf(mx, p.part_lse[slot0 + static_cast<int64_t>(s) * rows]);
  }
#pragma unroll
  for (int d = 16; d > 0; d /= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, d));
  if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = mx;
  __syncthreads();
#pragma unroll
  for (int w = 0; w < kThreads / 32; ++w) mx = fmaxf(mx, warp_max[w]);
  const float base = mx == -INFINITY ? 0.f : mx;

  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  float total = 0.f;
  for (int s0 = group * kBatch; s0 < live_splits; s0 += kGroups * kBatch) {
    float lse[kBatch];
    float4 o[kBatch];
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      const int64_t slot = slot0 + static_cast<int64_t>(s0 + j) * rows;
      const bool live = s0 + j < live_splits;
      lse[j] = live ? p.part_lse[slot] : -INFINITY;
      o[j] = live ? reinterpret_cast<const float4*>(p.part_o + slot * kValueDim)[col] : make_float4(0.f, 0.f, 0.f, 0.f);
    }
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      const float w = exp2f(lse[j] - base);
      total += w;
      acc.x += w * o[j].x;
      acc.y += w * o[j].y;
      acc.z += w * o[j].z;
      acc.w += w * o[j].w;
    }
  }
  if (group > 0) {
    group_acc[group - 1][col] = acc;
    if (col == 0) group_total[group - 1] = total;
  }
  __syncthreads();
  if (group > 0) return;
#pragma unroll
  for (int g = 0; g < kGroups - 1; ++g) {
    const float4 o = group_acc[g][col];
    acc.x += o.x;
    acc.y += o.y;
    acc.z += o.z;
    acc.w += o.w;
    total += group_total[g];
  }
  const float inv = total > 0.f ? 1.f / total : 0.f;
  const int64_t out_row = static_cast<int64_t>(p.qo_indptr[b]) * p.heads + r;
  uint2 packed;
  packed.x = pack_bf16x2(acc.x * inv, acc.y * inv);
  packed.y = pack_bf16x2(acc.z * inv, acc.w * inv);
  reinterpret_cast<uint2*>(static_cast<__nv_bfloat16*>(p.out) + out_row * kValueDim)[col] = packed;
  if (p.lse != nullptr && col == 0) p.lse[out_row] = total > 0.f ? (base + __log2f(total)) * kLn2 : -INFINITY;
}

int verify_smem_bytes(int row_groups, bool fp8) {
  switch (row_groups) {
    case 1:
      return fp8 ? fp8mma::kSmemBytes : TileConfig<1, kStages>::kSmemBytes;
    case 2:
      return fp8 ? TileConfig<2, kStages, true>::kSmemBytes : TileConfig<2, kStages>::kSmemBytes;
    case 3:
      return fp8 ? TileConfig<3, kStages, true>::kSmemBytes : TileConfig<3, kStages>::kSmemBytes;
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
  const dim3 grid(p.row_blocks, p.splits, p.bs);
  fn<<<grid, threads_for(p.row_groups, split, p.kv_fp8 != 0), smem, stream>>>(p);
  err = cudaGetLastError();
  if (err != cudaSuccess || p.splits == 1) return err;
  const dim3 combine_grid(p.q_len * p.heads, p.bs);
  // Few chunks (large batches): one group, a batch no wider than the chunks (registers, hence occupancy, of a
  // memory-bound pass). Many (small batches): up to 4 groups of 8-chunk batches.
  if (p.splits <= 2) {
    verify_combine_kernel<1, 2><<<combine_grid, kCombineCols, 0, stream>>>(p);
  } else if (p.splits <= 4) {
    verify_combine_kernel<1, 4><<<combine_grid, kCombineCols, 0, stream>>>(p);
  } else if (p.splits <= kCombineBatch) {
    verify_combine_kernel<1, kCombineBatch><<<combine_grid, kCombineCols, 0, stream>>>(p);
  } else if (p.splits <= 2 * kCombineBatch) {
    verify_combine_kernel<2, kCombineBatch><<<combine_grid, 2 * kCombineCols, 0, stream>>>(p);
  } else {
    verify_combine_kernel<4, kCombineBatch><<<combine_grid, 4 * kCombineCols, 0, stream>>>(p);
  }
  return cudaGetLastError();
}

}  // namespace kdtree
