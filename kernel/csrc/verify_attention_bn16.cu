// Instantiates the verify kernel for BN = 16 keys per tile and 4 shared-memory stages. Torch-free.
#include "verify_attention_kernel.cuh"
#include "verify_attention_tiles.h"

namespace kdtree {
namespace {

template <int RG>
VerifyKernelFn pick(bool int64_indices) {
  return int64_indices ? verify_attention_kernel<RG, 16, 4, int64_t> : verify_attention_kernel<RG, 16, 4, int32_t>;
}

}  // namespace

VerifyKernelFn verify_kernel_bn16(int row_groups, bool int64_indices) {
  switch (row_groups) {
    case 1:
      return pick<1>(int64_indices);
    case 2:
      return pick<2>(int64_indices);
    case 3:
      return pick<3>(int64_indices);
    default:
      return nullptr;
  }
}

int verify_smem_bytes_bn16(int row_groups) {
  switch (row_groups) {
    case 1:
      return TileConfig<1, 16, 4>::kSmemBytes;
    case 2:
      return TileConfig<2, 16, 4>::kSmemBytes;
    case 3:
      return TileConfig<3, 16, 4>::kSmemBytes;
    default:
      return 0;
  }
}

}  // namespace kdtree
