// Launch logic and the combine kernel. Torch-free: CI compiles the kernel units alone with nvcc for sm_120a
// and sm_90a (tests/kernel/test_compile.py), and the torch extension links the same objects.
#include <cuda_runtime.h>

#include "verify_attention.h"
#include "verify_attention_kernel.cuh"
#include "verify_attention_tiles.h"

namespace kdtree {
namespace {

VerifyKernelFn kernel_for(int row_groups, bool int64_indices) {
  return int64_indices ? verify_kernel_i64(row_groups) : verify_kernel_i32(row_groups);
}

int threads_for(int row_groups) { return (row_groups * kScoreHalves + kValueWarps) * 32; }

}  // namespace

// Merges the chunk partials of one (request, row): out = sum_s w_s O_s with w_s = 2^(lse_s - lse).
// Grid (rows, bs), 128 threads x 4 columns each.
__global__ void __launch_bounds__(128) verify_combine_kernel(const VerifyParams p) {
  const int r = blockIdx.x;
  const int b = blockIdx.y;
  const int rows = p.q_len * p.heads;
  const int kv_len = p.kv_indptr[b + 1] - p.kv_indptr[b];
  const int chunk = chunk_for(p, kv_len);
  const int live_splits = min(p.splits, (kv_len + chunk - 1) / chunk);
  const int64_t slot0 = static_cast<int64_t>(b) * p.splits * rows + r;
  float mx = -INFINITY;
  for (int s = 0; s < live_splits; ++s) mx = fmaxf(mx, p.part_lse[slot0 + static_cast<int64_t>(s) * rows]);
  const float base = mx == -INFINITY ? 0.f : mx;
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  float total = 0.f;
  for (int s = 0; s < live_splits; ++s) {
    const int64_t slot = slot0 + static_cast<int64_t>(s) * rows;
    const float w = exp2f(p.part_lse[slot] - base);
    const float4 o = reinterpret_cast<const float4*>(p.part_o + slot * kValueDim)[threadIdx.x];
    total += w;
    acc.x += w * o.x;
    acc.y += w * o.y;
    acc.z += w * o.z;
    acc.w += w * o.w;
  }
  const float inv = total > 0.f ? 1.f / total : 0.f;
  const int64_t out_row = static_cast<int64_t>(p.qo_indptr[b]) * p.heads + r;
  uint2 packed;
  packed.x = pack_bf16x2(acc.x * inv, acc.y * inv);
  packed.y = pack_bf16x2(acc.z * inv, acc.w * inv);
  reinterpret_cast<uint2*>(static_cast<__nv_bfloat16*>(p.out) + out_row * kValueDim)[threadIdx.x] = packed;
  if (p.lse != nullptr && threadIdx.x == 0) p.lse[out_row] = total > 0.f ? (base + __log2f(total)) * kLn2 : -INFINITY;
}

int verify_smem_bytes(int row_groups) {
  switch (row_groups) {
    case 1:
      return TileConfig<1, kStages>::kSmemBytes;
    case 2:
      return TileConfig<2, kStages>::kSmemBytes;
    case 3:
      return TileConfig<3, kStages>::kSmemBytes;
    default:
      return 0;
  }
}

int verify_blocks_per_sm(int row_groups) {
  VerifyKernelFn fn = kernel_for(row_groups, false);
  if (fn == nullptr) return 0;
  const int smem = verify_smem_bytes(row_groups);
  if (cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, smem) != cudaSuccess) return 0;
  int blocks = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, fn, threads_for(row_groups), smem) != cudaSuccess) {
    return 0;
  }
  return blocks;
}

cudaError_t launch_verify_attention(const VerifyParams& p, cudaStream_t stream) {
  if (p.row_groups < 1 || p.row_groups > kMaxRowGroups || p.q_len < 1 || p.q_len > kMaxQLen || p.bs < 1 ||
      p.splits < 1 || p.chunk_keys < 0 || p.chunk_keys % kChunkAlign != 0 || p.row_blocks < 1) {
    return cudaErrorInvalidValue;
  }
  VerifyKernelFn fn = kernel_for(p.row_groups, p.indices_are_int64 != 0);
  if (fn == nullptr) return cudaErrorInvalidValue;
  const int smem = verify_smem_bytes(p.row_groups);
  cudaError_t err = cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (err != cudaSuccess) return err;
  const dim3 grid(p.row_blocks, p.splits, p.bs);
  fn<<<grid, threads_for(p.row_groups), smem, stream>>>(p);
  err = cudaGetLastError();
  if (err != cudaSuccess || p.splits == 1) return err;
  const dim3 combine_grid(p.q_len * p.heads, p.bs);
  verify_combine_kernel<<<combine_grid, kValueDim / 4, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace kdtree
