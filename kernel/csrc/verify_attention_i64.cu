// The verify kernels (bf16 and fp8 pools) for int64 KV indices: verify_attention_instances.cuh.
#include "verify_attention_instances.cuh"

namespace kdtree {

VerifyKernelFn verify_kernel_i64(int row_groups, bool split_schedulers, bool fp8, bool qmma) {
  return verify_kernel_for<int64_t>(row_groups, split_schedulers, fp8, qmma);
}

}  // namespace kdtree
