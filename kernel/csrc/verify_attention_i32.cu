// Instantiates the verify kernel for int32 KV indices (one translation unit per index type, so the two
// compile in parallel). Torch-free.
#include "verify_attention_kernel.cuh"
#include "verify_attention_tiles.h"

namespace kdtree {

VerifyKernelFn verify_kernel_i32(int row_groups, bool split_schedulers) {
  switch (row_groups) {
    case 1:
      return verify_attention_kernel<1, kStages, int32_t, false>;
    case 2:
      return verify_attention_kernel<2, kStages, int32_t, false>;
    case 3:
      return split_schedulers ? verify_attention_kernel<3, kStages, int32_t, true>
                              : verify_attention_kernel<3, kStages, int32_t, false>;
    default:
      return nullptr;
  }
}

}  // namespace kdtree
