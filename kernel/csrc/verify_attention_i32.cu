// The verify kernels (bf16 and fp8 pools) for int32 KV indices: verify_attention_instances.cuh.
#include "verify_attention_instances.cuh"

namespace kdtree {

VerifyKernelFn verify_kernel_i32(int row_groups, bool split_schedulers, bool fp8, bool qmma) {
  return verify_kernel_for<int32_t>(row_groups, split_schedulers, fp8, qmma);
}

}  // namespace kdtree
