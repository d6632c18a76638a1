// The verify kernels of one KV index type, picked by row-group count, layout and pool dtype. Included only by the
// instantiation units (verify_attention_i32.cu, verify_attention_i64.cu): each instantiates verify_kernel_for for
// its index type, one translation unit per type so the two compile in parallel. Torch-free.
#pragma once

#include <cstdint>

#include "verify_attention_fp8mma.cuh"
#include "verify_attention_kernel.cuh"
#include "verify_attention_tiles.h"

namespace kdtree {

namespace {

template <typename Index, bool kFp8>
VerifyKernelFn pick(int row_groups, bool split_schedulers, bool qmma) {
  switch (row_groups) {
    case 1:  // fp8: the e4m3 tensor-core kernel (16-row blocks; verify_attention_fp8mma.cuh)
      if constexpr (kFp8) {
        return qmma ? verify_attention_kernel_fp8mma<Index, true> : verify_attention_kernel_fp8mma<Index, false>;
      }
      return verify_attention_kernel<1, stages_for(1), Index, false, false>;
    case 2:
      return verify_attention_kernel<2, stages_for(2), Index, false, kFp8>;
    case 3:
      return split_schedulers ? verify_attention_kernel<3, stages_for(3), Index, true, kFp8>
                              : verify_attention_kernel<3, stages_for(3), Index, false, kFp8>;
    default:
      return nullptr;
  }
}

// The arguments and result of verify_kernel_i32 / verify_kernel_i64 (verify_attention_tiles.h).
template <typename Index>
VerifyKernelFn verify_kernel_for(int row_groups, bool split_schedulers, bool fp8, bool qmma) {
  return fp8 ? pick<Index, true>(row_groups, split_schedulers, qmma)
             : pick<Index, false>(row_groups, split_schedulers, qmma);
}

}  // namespace

}  // namespace kdtree
