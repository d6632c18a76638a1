// Warp-level primitives used by the verify kernel: cp.async, ldmatrix, mma.sync m16n8k16 bf16 / fp16, and the
// e4m3 -> fp16 conversion of the fp8 KV path. Only instructions that exist on sm_89 and later (sm_90 and sm_120
// included): no wgmma, TMA or tcgen05.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace kdtree {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte global -> shared copy; src_bytes == 0 zero-fills the destination (rows past the end of a chunk).
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}

// 4/8/16-byte global -> shared copy through L1 (used for the small index vectors).
template <int kBytes>
__device__ __forceinline__ void cp_async_ca(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(dst), "l"(src), "n"(kBytes), "r"(src_bytes));
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }

// Waits until at most kPending of this thread's committed cp.async groups are still in flight.
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// Barrier over `threads` threads (a multiple of 32) under id `id` (1..15; 0 is __syncthreads).
__device__ __forceinline__ void named_barrier(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// Programmatic dependent launch (sm_90 and later; no-ops below): a kernel lets the next kernel of its stream,
// launched with programmatic stream serialization, start early (launch_dependents, once every block has called
// it or exited), and that kernel waits for the whole previous grid to finish and its writes to be visible (wait).
__device__ __forceinline__ void griddep_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void griddep_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t addr, uint32_t& r0, uint32_t& r1, uint32_t& r2,
                                            uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr));
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t addr, uint32_t& r0, uint32_t& r1, uint32_t& r2,
                                                  uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr));
}

// d += a * b for one 16x8 fp32 tile; a: 16x16 bf16 row-major fragment, b: 16x8 bf16 col-major fragment.
__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                               uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// The same for fp16 operands (the fp8 KV path: e4m3 keys and values widen to fp16 exactly).
__device__ __forceinline__ void mma_f16_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// The kernel's one mma, in the operand type of its KV path (kF16: the fp8 pool widened to fp16).
template <bool kF16>
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (kF16) {
    mma_f16_16816(d, a, b0, b1);
  } else {
    mma_bf16_16816(d, a, b0, b1);
  }
}

// Four e4m3 values (one 32-bit word, lowest byte first) -> four fp16 values (two f16x2 words, same order).
// Exact: every e4m3 value, subnormals included, is an fp16 value. One cvt per pair (sm_89+).
__device__ __forceinline__ uint2 e4m3x4_to_f16x4(uint32_t x) {
  uint32_t lo, hi;
  asm("{\n .reg .b16 l, h;\n mov.b32 {l, h}, %2;\n cvt.rn.f16x2.e4m3x2 %0, l;\n cvt.rn.f16x2.e4m3x2 %1, h;\n}\n"
      : "=r"(lo), "=r"(hi)
      : "r"(x));
  return make_uint2(lo, hi);
}

// 2^x with the MUFU unit (flushes denormals; 2^-inf = 0), as flash-attention kernels use it.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

__device__ __forceinline__ uint32_t pack_f16x2(float lo, float hi) {
  __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

template <bool kF16>
__device__ __forceinline__ uint32_t pack_16x2(float lo, float hi) {
  if constexpr (kF16) {
    return pack_f16x2(lo, hi);
  } else {
    return pack_bf16x2(lo, hi);
  }
}

// A bf16 pair (one 32-bit word) times `scale`, as an fp16 pair: the fp8 path's Q (see verify_attention_kernel.cuh).
__device__ __forceinline__ uint32_t bf16x2_to_f16x2(uint32_t v, float scale) {
  const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&v));
  return pack_f16x2(f.x * scale, f.y * scale);
}

}  // namespace kdtree

// ---- fp8 (e4m3) tensor-core path: sm_89 and later (sm_90, sm_120) ----
namespace kdtree {

// d += a * b for one 16x8 fp32 tile with e4m3 operands: a 16x32 row-major (four bytes per register, lowest k
// first), b 32x8 col-major. Fragments: a0 / a2 = row g, k 4c..4c+3 / 16+4c..; a1 / a3 = row g + 8 (the int8
// m16n8k32 layout); b0 / b1 = column g, k 4c..4c+3 / 16+4c..; d as for m16n8k16.
__device__ __forceinline__ void mma_e4m3_16832(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two floats -> two e4m3 (round to nearest, saturating to +-448): `lo` in the low byte.
__device__ __forceinline__ uint32_t f32x2_to_e4m3x2(float lo, float hi) {
  uint16_t r;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(r) : "f"(hi), "f"(lo));
  return r;
}

// Two e4m3 (low byte first) -> two floats (exact).
__device__ __forceinline__ float2 e4m3x2_to_f32x2(uint32_t x) {
  uint32_t h;
  const uint16_t x16 = static_cast<uint16_t>(x);
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;\n" : "=r"(h) : "h"(x16));
  return __half22float2(*reinterpret_cast<const __half2*>(&h));
}

// Four floats as a two-term e4m3 sum on one scale: hi = e4m3(x), lo = e4m3(x - hi) (bytes in argument order).
// hi + lo carries ~7 significant bits where e4m3 alone carries 4; used for Q and P, whose single-e4m3 rounding
// costs ~6e-2 and ~1.4e-2 of output error on random data (docs/fp8.md), the two-term sum ~1e-3.
__device__ __forceinline__ void split_e4m3x4(float a, float b, float c, float d, uint32_t& hi, uint32_t& lo) {
  const uint32_t h01 = f32x2_to_e4m3x2(a, b);
  const uint32_t h23 = f32x2_to_e4m3x2(c, d);
  const float2 r01 = e4m3x2_to_f32x2(h01);
  const float2 r23 = e4m3x2_to_f32x2(h23);
  hi = h01 | (h23 << 16);
  lo = f32x2_to_e4m3x2(a - r01.x, b - r01.y) | (f32x2_to_e4m3x2(c - r23.x, d - r23.y) << 16);
}

}  // namespace kdtree
