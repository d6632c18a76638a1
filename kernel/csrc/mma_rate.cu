// Diagnostic used by the benchmark: sustained mma.sync m16n8k16 bf16 rate with operands in registers, the
// tensor-core ceiling this kernel family can reach on sm_90 and sm_120 (no wgmma/tcgen05). Torch-free.
#include <cuda_runtime.h>

#include "mma_primitives.cuh"
#include "mma_rate.h"

namespace kdtree {
namespace {

constexpr int kChains = 8;  // independent accumulators per warp, enough to hide the mma latency

__global__ void mma_rate_kernel(float* sink, int iters, uint32_t seed) {
  const uint32_t a[4] = {seed ^ threadIdx.x, seed + 1u, seed * 3u, seed ^ 0x3f803f80u};
  const uint32_t b0 = seed ^ 0x3f003f00u;
  const uint32_t b1 = seed + threadIdx.x;
  float acc[kChains][4] = {};
  for (int i = 0; i < iters; ++i) {
#pragma unroll
    for (int c = 0; c < kChains; ++c) mma_bf16_16816(acc[c], a, b0, b1);
  }
  float total = 0.f;
#pragma unroll
  for (int c = 0; c < kChains; ++c) total += acc[c][0] + acc[c][1] + acc[c][2] + acc[c][3];
  if (total == 1.2345f) sink[blockIdx.x] = total;  // practically never true; keeps the loop alive
}

}  // namespace

double mma_flops_per_launch(int blocks, int warps, int iters) {
  return static_cast<double>(blocks) * warps * iters * kChains * (2.0 * 16 * 8 * 16);
}

cudaError_t launch_mma_rate(float* sink, int blocks, int warps, int iters, cudaStream_t stream) {
  mma_rate_kernel<<<blocks, warps * 32, 0, stream>>>(sink, iters, 0x3f803f80u);
  return cudaGetLastError();
}

}  // namespace kdtree
