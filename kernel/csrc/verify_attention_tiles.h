// Kernel instantiations, one translation unit per KV index type so they compile in parallel.
#pragma once

#include "verify_attention.h"

namespace kdtree {

using VerifyKernelFn = void (*)(const VerifyParams);

// Row groups 1..kMaxRowGroups; nullptr for anything else.
VerifyKernelFn verify_kernel_i32(int row_groups);  // verify_attention_i32.cu
VerifyKernelFn verify_kernel_i64(int row_groups);  // verify_attention_i64.cu

}  // namespace kdtree
