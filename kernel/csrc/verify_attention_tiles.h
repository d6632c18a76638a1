// Kernel tile configurations, each instantiated in its own translation unit so they compile in parallel.
#pragma once

#include "verify_attention.h"

namespace kdtree {

using VerifyKernelFn = void (*)(const VerifyParams);

// BN = 32 keys per tile, 2 shared-memory stages (verify_attention_bn32.cu).
VerifyKernelFn verify_kernel_bn32(int row_groups, bool int64_indices);
int verify_smem_bytes_bn32(int row_groups);

// BN = 16 keys per tile, 4 shared-memory stages (verify_attention_bn16.cu).
VerifyKernelFn verify_kernel_bn16(int row_groups, bool int64_indices);
int verify_smem_bytes_bn16(int row_groups);

}  // namespace kdtree
