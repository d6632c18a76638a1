// Benchmark diagnostic, not part of the shipped extension: the sustained mma.sync m16n8k16 bf16 rate with
// operands in registers, the tensor-core ceiling the verify kernels can reach on sm_90 and sm_120 (they use no
// wgmma / tcgen05). Torch-free: kernel/bench/mma_probe.py builds it into a small shared library with nvcc and
// calls the two C entry points below through ctypes.
#include <cuda_runtime.h>

#include "mma_primitives.cuh"

namespace {

constexpr int kChains = 8;  // independent accumulators per warp, enough to hide the mma latency

__global__ void mma_rate_kernel(float* sink, int iters, uint32_t seed) {
  const uint32_t a[4] = {seed ^ threadIdx.x, seed + 1u, seed * 3u, seed ^ 0x3f803f80u};
  const uint32_t b0 = seed ^ 0x3f003f00u;
  const uint32_t b1 = seed + threadIdx.x;
  float acc[kChains][4] = {};
  for (int i = 0; i < iters; ++i) {
#pragma unroll
    for (int c = 0; c < kChains; ++c) kdtree::mma_bf16_16816(acc[c], a, b0, b1);
  }
  float total = 0.f;
#pragma unroll
  for (int c = 0; c < kChains; ++c) total += acc[c][0] + acc[c][1] + acc[c][2] + acc[c][3];
  if (total == 1.2345f) sink[blockIdx.x] = total;  // practically never true; keeps the loop alive
}

}  // namespace

// Floating-point operations one launch of kdtree_mma_rate_launch() performs.
extern "C" double kdtree_mma_rate_flops(int blocks, int warps, int iters) {
  return static_cast<double>(blocks) * warps * iters * kChains * (2.0 * 16 * 8 * 16);
}

// Enqueues `blocks` blocks of `warps` warps on `stream`, each issuing `iters` x 8 independent m16n8k16 bf16
// mma.sync; returns the launch's cudaError_t (0: enqueued).
extern "C" int kdtree_mma_rate_launch(float* sink, int blocks, int warps, int iters, void* stream) {
  mma_rate_kernel<<<blocks, warps * 32, 0, static_cast<cudaStream_t>(stream)>>>(sink, iters, 0x3f803f80u);
  return static_cast<int>(cudaGetLastError());
}
