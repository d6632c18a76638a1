// Instantiates the verify kernel (bf16 and fp8 pools) for int32 KV indices (one translation unit per index type, so the two
// compile in parallel). Torch-free.
#include "verify_attention_fp8mma.cuh"
#include "verify_attention_kernel.cuh"
#include "verify_attention_tiles.h"

namespace kdtree {

namespace {

template <bool kFp8>
VerifyKernelFn pick(int row_groups, bool split_schedulers, bool qmma) {
  switch (row_groups) {
    case 1:  // fp8: the e4m3 tensor-core kernel (16-row blocks; verify_attention_fp8mma.cuh)
      if constexpr (kFp8) {
        return qmma ? verify_attention_kernel_fp8mma<int32_t, true> : verify_attention_kernel_fp8mma<int32_t, false>;
      }
      return verify_attention_kernel<1, stages_for(1), int32_t, false, false>;
    case 2:
      return verify_attention_kernel<2, stages_for(2), int32_t, false, kFp8>;
    case 3:
      return split_schedulers ? verify_attention_kernel<3, stages_for(3), int32_t, true, kFp8>
                              : verify_attention_kernel<3, stages_for(3), int32_t, false, kFp8>;
    default:
      return nullptr;
  }
}

}  // namespace

VerifyKernelFn verify_kernel_i32(int row_groups, bool split_schedulers, bool fp8, bool qmma) {
  return fp8 ? pick<true>(row_groups, split_schedulers, qmma) : pick<false>(row_groups, split_schedulers, qmma);
}

}  // namespace kdtree
