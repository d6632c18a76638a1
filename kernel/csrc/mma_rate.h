// mma.sync bf16 throughput probe (benchmark diagnostic). Torch-free.
#pragma once

#include <cuda_runtime.h>

namespace kdtree {

// Floating-point operations one launch of launch_mma_rate() performs.
double mma_flops_per_launch(int blocks, int warps, int iters);

// Enqueues `blocks` blocks of `warps` warps, each issuing `iters` x 8 independent m16n8k16 bf16 mma.sync.
cudaError_t launch_mma_rate(float* sink, int blocks, int warps, int iters, cudaStream_t stream);

}  // namespace kdtree
