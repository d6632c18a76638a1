// Kernel instantiations, one translation unit per KV index type so they compile in parallel (both the same
// template: verify_attention_instances.cuh).
#pragma once

#include "verify_attention.h"

namespace kdtree {

using VerifyKernelFn = void (*)(const VerifyParams);

// Row groups 1..kMaxRowGroups; nullptr for anything else. split_schedulers picks the RG = 3 block's split
// layout (verify_attention_kernel.cuh, score_slot); the other row-group counts have one layout. fp8: the
// float8_e4m3fn pool's kernel; qmma: for one row group, its e4m3 mma.sync form (else fp16 mma.sync with the
// fragments widened in registers: sm_90, which has no e4m3 mma.sync in hardware; verify_attention_fp8mma.cuh).
VerifyKernelFn verify_kernel_i32(int row_groups, bool split_schedulers, bool fp8, bool qmma);  // verify_attention_i32.cu
VerifyKernelFn verify_kernel_i64(int row_groups, bool split_schedulers, bool fp8, bool qmma);  // verify_attention_i64.cu

}  // namespace kdtree
