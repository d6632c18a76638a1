// Instantiates the verify kernel for int64 KV indices (one translation unit per index type, so the two
// compile in parallel). Torch-free.
#include "verify_attention_kernel.cuh"
#include "verify_attention_tiles.h"

namespace kdtree {

VerifyKernelFn verify_kernel_i64(int row_groups) {
  switch (row_groups) {
    case 1:
      return verify_attention_kernel<1, kStages, int64_t>;
    case 2:
      return verify_attention_kernel<2, kStages, int64_t>;
    case 3:
      return verify_attention_kernel<3, kStages, int64_t>;
    default:
      return nullptr;
  }
}


}  // namespace kdtree
