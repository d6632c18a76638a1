// FP8 KV verify attention on e4m3 tensor cores (mma.sync m16n8k32, sm_89 / sm_90 / sm_120), plain CUDA, no torch.
//
// Serves SGLang's --kv-cache-dtype fp8_e4m3 pool (float8_e4m3fn rows, keys = row * k_scale, values =
// row[:512] * v_scale) for blocks of 16 (token, head) rows of one request; a request with more rows runs as
// several such blocks over the same keys (the later reads mostly hit L2). The raw e4m3 rows feed the tensor
// cores as they are: no conversion pass, half the shared-memory bytes of a 16-bit tile.
//
// Precision. Q (bf16) and P (fp32) are not e4m3: each is carried as a two-term e4m3 sum on one scale,
// x ~ hi + lo (split_e4m3x4), and each product is two mma into the same fp32 accumulator. Q uses a per-row
// scale (row amax -> 448), P a fixed 2^8 (P <= 1 after the running max). Single-term e4m3 Q and P, as SGLang's
// fp8 Triton path rounds them, cost ~6e-2 of output error on random data; the two-term sums ~1e-3 (docs/fp8.md).
// The tensor work then equals the fp16 path's (k32 e4m3 mma do twice the k16 work), with no conversion.
//
// Block: 4 warps, one 16-row block x one KV chunk, 64-key tiles, 2 shared-memory stages, no role split.
// Per tile, warp w scores keys 16w..16w+15 against all 576 dims (QK split by keys: K is read once per block),
// the 4 warps exchange only their row maxima (one barrier), each writes its keys' P (two-term e4m3) to shared
// memory, and after a second barrier every warp multiplies the whole tile's P by V for its own 128 of the 512
// output columns. V is read from the same raw stage as K: ldmatrix.trans moves 16-bit pairs, so each lane gets
// two keys x two dims per register, and two byte permutes (prmt) make the k32 B fragment of the even and of the
// odd dims of a 16-dim group; P's keys are stored in the matching order (kernel-internal; the sum over keys is
// order-free). Small blocks (96 KB) let two run on an H200 SM, overlapping one block's barriers with the other's
// work; the chain per key is 4x shorter than the bf16 kernel's 16-key step.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "mma_primitives.cuh"
#include "verify_attention.h"
#include "verify_attention_rows.cuh"

namespace kdtree {
namespace fp8mma {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kRows = 16;                          // (token, head) rows per block
constexpr int kTileKeys = 64;                      // keys per tile (16 per warp in QK)
constexpr int kKvStages = 2;
constexpr int kRowPitch = kHeadDim + 16;           // 592 B: 8 rows at one column hit 8 distinct 16-B bank groups
constexpr int kKSteps = kHeadDim / 32;             // k32 steps of S = Q K^T (18)
constexpr int kWarpCols = kValueDim / kWarps;      // output columns per warp (128)
constexpr int kColGroups = kWarpCols / 16;         // 16-dim groups per warp (two n8 tiles each: even, odd dims)
constexpr int kPPitch = kTileKeys + 16;            // 80 B per P row (conflict-free ldmatrix)
constexpr int kPShift = 8;                         // P is stored times 2^8 (P <= 1; keeps small P out of subnormals)
constexpr int kLoadLanes = 4;                      // threads per key row of a gather
constexpr int kRowsPerPass = kThreads / kLoadLanes;  // 32
constexpr int kPasses = kTileKeys / kRowsPerPass;    // 2
constexpr int kPiecesPerLane = kHeadDim / 16 / kLoadLanes;  // 9 x 16 B
static_assert(kHeadDim % (16 * kLoadLanes) == 0, "a key row splits evenly over its copy lanes");
static_assert(kTileKeys == kWarps * 16, "QK: one 16-key pair of n8 tiles per warp");
static_assert(kValueDim % (kWarps * 16) == 0, "PV: 16-dim groups per warp");

constexpr int kStageBytes = kTileKeys * kRowPitch;
constexpr int kQOffset = kKvStages * kStageBytes;    // Q hi, then Q lo: [16][592] e4m3 each
constexpr int kQBytes = kRows * kRowPitch;
constexpr int kPOffset = kQOffset + 2 * kQBytes;   // P hi, then P lo: [16][80] e4m3 each
constexpr int kPBytes = kRows * kPPitch;
constexpr int kMaxOffset = kPOffset + 2 * kPBytes;  // float [warps][16]: each warp's tile row maxima
constexpr int kFactorOffset = kMaxOffset + kWarps * kRows * 4;  // float [16]: Q row scale x softmax scale
constexpr int kSumOffset = kFactorOffset + kRows * 4;           // float [warps][16]: row sums at the end
constexpr int kSmemBytes = kSumOffset + kWarps * kRows * 4;
static_assert(kSmemBytes <= 99 * 1024, "fits sm_120's 99 KB per block");

// fp16 (sm_90) form: Q rows in fp16, and P in fp16 with keys in natural order.
constexpr int kQ16Pitch = kHeadDim * 2 + 16;  // 1168 B
constexpr int kP16Pitch = kTileKeys * 2 + 16; // 144 B
static_assert(kRows * kQ16Pitch <= 2 * kQBytes && kRows * kP16Pitch <= 2 * kPBytes, "fp16 Q and P fit their slots");

// Position (in fp16 elements) of Q's even dim d: an x4 ldmatrix of raw K gives a lane the 4 bytes of dims
// 16 s + 4c .. + 3 of its key (16-dim block s); widened they are the m16n8k16 B fragment's k 2c, 2c + 1 (dims
// 4c, 4c + 1) and 8 + 2c, 9 + 2c (dims 4c + 2, 4c + 3), so Q's A fragment must hold the same dims there.
__device__ __forceinline__ int q16_slot(int d) {
  const int base = d & ~15;
  const int c = (d & 15) / 4;
  return base + ((d & 2) ? 8 : 0) + 2 * c;
}

// Two e4m3 bytes (selected from a register by a byte_perm selector) widened to an fp16 pair.
__device__ __forceinline__ uint32_t widen_pair(uint32_t x, uint32_t selector) {
  const uint16_t b = static_cast<uint16_t>(__byte_perm(x, 0u, selector));
  uint32_t h;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;\n" : "=r"(h) : "h"(b));
  return h;
}

__device__ __forceinline__ void ldsm_x4(uint32_t addr, uint32_t (&r)[4]) { ldmatrix_x4(addr, r[0], r[1], r[2], r[3]); }
__device__ __forceinline__ void ldsm_x4_t(uint32_t addr, uint32_t (&r)[4]) {
  ldmatrix_x4_trans(addr, r[0], r[1], r[2], r[3]);
}

}  // namespace fp8mma

// kQmma: e4m3 mma.sync (native QMMA on sm_89 / sm_120). Otherwise fp16 mma.sync with the e4m3 K and V fragments
// widened in registers (one cvt per two values) and Q, P in fp16: sm_90 has no QMMA (ptxas lowers e4m3
// mma.sync to two HMMA.16816 plus a conversion of every A and B register, Q's and P's included), so there this
// form does half the tensor instructions and a third of the conversions for the same result.
template <typename IdxT, bool kQmma>
__global__ void __launch_bounds__(fp8mma::kThreads, 2) verify_attention_kernel_fp8mma(const VerifyParams p) {
  using namespace fp8mma;
  constexpr int kShift = kQmma ? kPShift : 0;  // P's scale (log2) in shared memory
  constexpr float kQRange = kQmma ? 448.f : 256.f;  // a row's amax maps here (e4m3 max; fp16: well inside)
  extern __shared__ __align__(128) unsigned char smem[];
  const int row_block = blockIdx.x;
  const int split = blockIdx.y;
  const int b = blockIdx.z;
  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int lane = tid % 32;
  const int g = lane / 4;
  const int c = lane % 4;
  const int rows = p.q_len * p.heads;
  const int block_row0 = row_block * kRows;
  griddep_wait();  // launched as a programmatic dependent: the previous kernel's writes are visible from here
  const int q_tok0 = p.qo_indptr[b];
  const int64_t out_row0 = static_cast<int64_t>(q_tok0) * p.heads;

  const int kv_begin = p.kv_indptr[b];
  const int kv_len = request_keys(p, b);
  if (kv_len == 0) {  // malformed request: read no key; zeros (LSE -inf) when this block owns the output
    if (p.splits > 1) {
      mark_chunk_empty(p, b, split, block_row0, kRows, tid);
    } else if (split == 0) {
      write_empty_rows(p, q_tok0, block_row0, kRows, tid, kThreads);
    }
    return;
  }
  const int prefix = kv_len - p.q_len;
  const int chunk = chunk_for(p, kv_len);
  const int key_lo = split * chunk;
  if (key_lo >= kv_len) {
    mark_chunk_empty(p, b, split, block_row0, kRows, tid);
    return;
  }
  const int key_hi = min(kv_len, key_lo + chunk);
  const int n_tiles = (key_hi - key_lo + kTileKeys - 1) / kTileKeys;

  const IdxT* indices = static_cast<const IdxT*>(p.kv_indices) + kv_begin;
  const unsigned char* kv = static_cast<const unsigned char*>(p.kv);
  const uint32_t smem_base = smem_addr(smem);
  float* max_smem = reinterpret_cast<float*>(smem + kMaxOffset);
  float* factor_smem = reinterpret_cast<float*>(smem + kFactorOffset);
  float* sum_smem = reinterpret_cast<float*>(smem + kSumOffset);

  // Gathers: thread (row tid / 4 + 32 pass, lane tid % 4) copies pieces lane, lane + 4, ... of its key row.
  const int load_row = tid / kLoadLanes;
  const int load_lane = tid % kLoadLanes;
  int64_t pool_row[kPasses];
  auto fetch_rows = [&](int tile) {
#pragma unroll
    for (int ps = 0; ps < kPasses; ++ps) {
      const int key = key_lo + tile * kTileKeys + load_row + ps * kRowsPerPass;
      pool_row[ps] = key < key_hi ? static_cast<int64_t>(__ldg(indices + key)) : -1;
    }
  };
  auto gather = [&](int tile) {
    const uint32_t stage = smem_base + (tile % kKvStages) * kStageBytes;
#pragma unroll
    for (int ps = 0; ps < kPasses; ++ps) {
      const int r = load_row + ps * kRowsPerPass;
      const bool live = pool_row[ps] >= 0;
      const unsigned char* src = kv + (live ? pool_row[ps] : 0) * p.kv_row_stride + load_lane * 16;
      const uint32_t dst = stage + r * kRowPitch + load_lane * 16;
#pragma unroll
      for (int j = 0; j < kPiecesPerLane; ++j) {
        cp_async_16(dst + j * 16 * kLoadLanes, src + j * 16 * kLoadLanes, live ? 16 : 0);
      }
    }
    cp_async_commit();
  };

  fetch_rows(0);
  gather(0);
  if (n_tiles > 1) fetch_rows(1);

  // Q: warp w quantizes rows 4w..4w+3 (two-term e4m3 on the row's scale 448 / amax) into shared memory.
  {
    const __nv_bfloat16* q = static_cast<const __nv_bfloat16*>(p.q);
    // p.scale_log2 carries the widening path's Q prescale (2^kFp8QShift, binding.cpp); this path has its own.
    const float scale_log2 = p.scale_log2 * (1.f / (1 << kFp8QShift));
#pragma unroll
    for (int i = 0; i < kRows / kWarps; ++i) {
      const int local = warp * (kRows / kWarps) + i;
      const int r = block_row0 + local;
      const bool live = r < rows;
      const int token = live ? r / p.heads : 0;
      const int head = live ? r - token * p.heads : 0;
      const __nv_bfloat16* qrow = q + static_cast<int64_t>(q_tok0 + token) * p.q_stride_token + head * p.q_stride_head;
      constexpr int kPairs = kHeadDim / 2 / 32;  // bf16 pairs per lane (9)
      float2 x[kPairs];
      float amax = 0.f;
#pragma unroll
      for (int j = 0; j < kPairs; ++j) {
        const uint32_t v = live ? __ldg(reinterpret_cast<const unsigned int*>(qrow) + lane + 32 * j) : 0u;
        x[j] = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&v));
        amax = fmaxf(amax, fmaxf(fabsf(x[j].x), fabsf(x[j].y)));
      }
#pragma unroll
      for (int d = 16; d > 0; d /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, d));
      const float to_q = amax > 0.f ? kQRange / amax : 0.f;
      if (lane == 0) factor_smem[local] = amax > 0.f ? amax / kQRange * scale_log2 : 0.f;
      unsigned char* hi_row = smem + kQOffset + local * (kQmma ? kRowPitch : kQ16Pitch);
      unsigned char* lo_row = hi_row + kQBytes;
#pragma unroll
      for (int j = 0; j < kPairs; ++j) {
        const float a = x[j].x * to_q;
        const float bb = x[j].y * to_q;
        const int d = 2 * (lane + 32 * j);  // dims d, d + 1
        if constexpr (kQmma) {
          const uint32_t h = f32x2_to_e4m3x2(a, bb);
          const float2 back = e4m3x2_to_f32x2(h);
          const uint32_t l = f32x2_to_e4m3x2(a - back.x, bb - back.y);
          *reinterpret_cast<uint16_t*>(hi_row + d) = static_cast<uint16_t>(h);
          *reinterpret_cast<uint16_t*>(lo_row + d) = static_cast<uint16_t>(l);
        } else {
          // fp16 Q in the k order the widened K fragments have (q16_slot).
          *reinterpret_cast<uint32_t*>(hi_row + 2 * q16_slot(d)) = pack_f16x2(a, bb);
        }
      }
    }
  }

  // Rows of this lane's fragments (g, g + 8): draft token for the tree mask.
  int token[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int r = block_row0 + g + 8 * i;
    token[i] = r < rows ? r / p.heads : 0;
  }
  float row_max[2] = {-INFINITY, -INFINITY};
  float row_sum[2] = {0.f, 0.f};  // this lane's keys only; summed over the quad and the warps at the end
  float factor[2] = {0.f, 0.f};
  float acc[kColGroups][2][4];
#pragma unroll
  for (int q = 0; q < kColGroups; ++q) {
#pragma unroll
    for (int h = 0; h < 2; ++h) acc[q][h][0] = acc[q][h][1] = acc[q][h][2] = acc[q][h][3] = 0.f;
  }
  // ldmatrix lane offsets. Q / P (A operand, 16 rows x 32 bytes): lanes 0-15 rows 0-15 at bytes 0-15, lanes
  // 16-31 rows 0-15 at bytes 16-31. K (B operand of 16 keys): lanes 0-7 keys 0-7 / bytes 0-15, 8-15 keys 0-7 /
  // bytes 16-31, 16-23 keys 8-15 / bytes 0-15, 24-31 keys 8-15 / bytes 16-31. V (.trans, 32 keys x 16 dims):
  // lane l reads key l.
  const uint32_t a_lane = (lane & 15) * (kQmma ? kRowPitch : kQ16Pitch) + (lane >> 4) * 16;
  const uint32_t p_lane = (lane & 15) * (kQmma ? kPPitch : kP16Pitch) + (lane >> 4) * 16;
  const uint32_t k_lane = (16 * warp + (lane & 7) + ((lane >> 4) << 3)) * kRowPitch + ((lane >> 3) & 1) * 16;
  const uint32_t v_lane = lane * kRowPitch + warp * kWarpCols;
  const uint32_t q_hi = smem_base + kQOffset + a_lane;
  const uint32_t q_lo = q_hi + kQBytes;
  const uint32_t p_hi = smem_base + kPOffset + p_lane;
  const uint32_t p_lo = p_hi + kPBytes;
  // Where this lane's P bytes go: row g (+ 8), keys 16w + 8t + 2c + e stored at 32 (w / 2) + 16 (w % 2) + 4c + 2t + e
  // (the order the V fragments' byte permutes produce).
  // fp16 form: keys in natural order, 2 bytes each.
  unsigned char* p_store = kQmma ? smem + kPOffset + g * kPPitch + 32 * (warp / 2) + 16 * (warp % 2) + 4 * c
                                 : smem + kPOffset + g * kP16Pitch + 2 * (16 * warp + 2 * c);

  for (int t = 0; t < n_tiles; ++t) {
    cp_async_wait<0>();
    __syncthreads();  // tile t has landed for all; every warp is done with tile t - 1 (its stage, P, maxima)
    if (t == 0) {
      factor[0] = factor_smem[g];
      factor[1] = factor_smem[g + 8];
    }
    if (t + 1 < n_tiles) {
      gather(t + 1);
      if (t + 2 < n_tiles) fetch_rows(t + 2);
    }
    const uint32_t stage = smem_base + (t % kKvStages) * kStageBytes;
    const int tile_key0 = key_lo + t * kTileKeys;

    // S = Q K^T for 16 rows x this warp's 16 keys: hi and lo Q terms in separate chains, fragments one step ahead.
    float s[2][4] = {};
    float sl[2][4] = {};
    if constexpr (kQmma) {
      uint32_t qa[2][4], ql[2][4], kb[2][4];
      ldsm_x4(q_hi, qa[0]);
      ldsm_x4(q_lo, ql[0]);
      ldsm_x4(stage + k_lane, kb[0]);
#pragma unroll
      for (int j = 0; j < kKSteps; ++j) {
        const int cur = j % 2;
        if (j + 1 < kKSteps) {
          ldsm_x4(q_hi + 32 * (j + 1), qa[cur ^ 1]);
          ldsm_x4(q_lo + 32 * (j + 1), ql[cur ^ 1]);
          ldsm_x4(stage + k_lane + 32 * (j + 1), kb[cur ^ 1]);
        }
        mma_e4m3_16832(s[0], qa[cur], kb[cur][0], kb[cur][1]);
        mma_e4m3_16832(s[1], qa[cur], kb[cur][2], kb[cur][3]);
        mma_e4m3_16832(sl[0], ql[cur], kb[cur][0], kb[cur][1]);
        mma_e4m3_16832(sl[1], ql[cur], kb[cur][2], kb[cur][3]);
      }
    } else {
      // Per 32 dims: K regs 0 / 1 = key g of n-tile 0 at dims 32j + 4c.. / 32j + 16 + 4c.., regs 2 / 3 n-tile 1;
      // each widens to the (b0, b1) of one k16 step; Q's two k16 A fragments sit at +0 and +32 bytes of 64 j.
      uint32_t qa[2][2][4], kb[2][4];
      ldsm_x4(q_hi, qa[0][0]);
      ldsm_x4(q_hi + 32, qa[0][1]);
      ldsm_x4(stage + k_lane, kb[0]);
#pragma unroll
      for (int j = 0; j < kKSteps; ++j) {
        const int cur = j % 2;
        if (j + 1 < kKSteps) {
          ldsm_x4(q_hi + 64 * (j + 1), qa[cur ^ 1][0]);
          ldsm_x4(q_hi + 64 * (j + 1) + 32, qa[cur ^ 1][1]);
          ldsm_x4(stage + k_lane + 32 * (j + 1), kb[cur ^ 1]);
        }
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          float(&acc_s)[2][4] = h == 0 ? s : sl;  // two chains: the two k16 halves
#pragma unroll
          for (int nt = 0; nt < 2; ++nt) {
            const uint32_t k4 = kb[cur][2 * nt + h];
            mma_f16_16816(acc_s[nt], qa[cur][h], widen_pair(k4, 0x10), widen_pair(k4, 0x32));
          }
        }
      }
    }
    // Scaled log2-domain scores; keys past the chunk and drafts the tree hides from the row are -inf.
    const int warp_key0 = tile_key0 + 16 * warp;
    const bool edge = warp_key0 + 16 > prefix || warp_key0 + 16 > key_hi;
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float x = (s[nt][e] + sl[nt][e]) * factor[e >> 1];
        if (edge) {
          const int key = warp_key0 + 8 * nt + 2 * c + (e & 1);
          bool visible = key < key_hi;
          if (visible && key >= prefix) {
            const int j = key - prefix;
            const uint64_t* mask_row = p.draft_mask + static_cast<int64_t>(q_tok0 + token[e >> 1]) * p.mask_words;
            visible = (__ldg(reinterpret_cast<const unsigned long long*>(mask_row) + (j >> 6)) >> (j & 63)) & 1ull;
          }
          if (!visible) x = -INFINITY;
        }
        s[nt][e] = x;
      }
    }
    // Row maxima of this warp's keys -> shared memory; after the barrier every warp takes the tile's maximum.
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      float m = fmaxf(fmaxf(s[0][2 * i], s[0][2 * i + 1]), fmaxf(s[1][2 * i], s[1][2 * i + 1]));
      m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
      m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
      if (c == 0) max_smem[warp * kRows + g + 8 * i] = m;
    }
    __syncthreads();
    float alpha[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      float m = row_max[i];
#pragma unroll
      for (int w = 0; w < kWarps; ++w) m = fmaxf(m, max_smem[w * kRows + g + 8 * i]);
      const float base = m == -INFINITY ? 0.f : m;  // nothing visible yet: zero weight, no NaN
      alpha[i] = fast_exp2(row_max[i] - base);
      row_max[i] = m;
      // P times 2^kShift: the shift rides in the exponent.
      const float shifted = base - kShift;
      const float e0 = fast_exp2(s[0][2 * i] - shifted);
      const float e1 = fast_exp2(s[0][2 * i + 1] - shifted);
      const float e2 = fast_exp2(s[1][2 * i] - shifted);
      const float e3 = fast_exp2(s[1][2 * i + 1] - shifted);
      row_sum[i] = row_sum[i] * alpha[i] + (e0 + e1 + e2 + e3);
      if constexpr (kQmma) {
        uint32_t hi, lo;
        split_e4m3x4(e0, e1, e2, e3, hi, lo);
        *reinterpret_cast<uint32_t*>(p_store + 8 * i * kPPitch) = hi;
        *reinterpret_cast<uint32_t*>(p_store + kPBytes + 8 * i * kPPitch) = lo;
      } else {
        *reinterpret_cast<uint32_t*>(p_store + 8 * i * kP16Pitch) = pack_f16x2(e0, e1);
        *reinterpret_cast<uint32_t*>(p_store + 8 * i * kP16Pitch + 16) = pack_f16x2(e2, e3);
      }
    }
    if (__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) {
#pragma unroll
      for (int q = 0; q < kColGroups; ++q) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          acc[q][h][0] *= alpha[0];
          acc[q][h][1] *= alpha[0];
          acc[q][h][2] *= alpha[1];
          acc[q][h][3] *= alpha[1];
        }
      }
    }
    __syncthreads();  // the tile's P is in shared memory

    // O[:, this warp's 128 dims] += P V over the tile's 64 keys (two k32 halves).
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      uint32_t pa[4], pl[4], vr[2][4];
      if constexpr (kQmma) {
        ldsm_x4(p_hi + 32 * half, pa);
        ldsm_x4(p_lo + 32 * half, pl);
      } else {
        ldsm_x4(p_hi + 64 * half, pa);       // keys 32 half + 0..15
        ldsm_x4(p_hi + 64 * half + 32, pl);  // keys 32 half + 16..31
      }
      const uint32_t v_base = stage + v_lane + 32 * half * kRowPitch;
      ldsm_x4_t(v_base, vr[0]);
#pragma unroll
      for (int q = 0; q < kColGroups; ++q) {
        const int cur = q % 2;
        if (q + 1 < kColGroups) ldsm_x4_t(v_base + 16 * (q + 1), vr[cur ^ 1]);
        // vr[m] holds keys 8m + 2c, 8m + 2c + 1 x dims 2g, 2g + 1 of the group: even dims are bytes 0 and 2.
        if constexpr (kQmma) {
          const uint32_t even0 = __byte_perm(vr[cur][0], vr[cur][1], 0x6420);
          const uint32_t even1 = __byte_perm(vr[cur][2], vr[cur][3], 0x6420);
          const uint32_t odd0 = __byte_perm(vr[cur][0], vr[cur][1], 0x7531);
          const uint32_t odd1 = __byte_perm(vr[cur][2], vr[cur][3], 0x7531);
          mma_e4m3_16832(acc[q][0], pa, even0, even1);
          mma_e4m3_16832(acc[q][1], pa, odd0, odd1);
          mma_e4m3_16832(acc[q][0], pl, even0, even1);
          mma_e4m3_16832(acc[q][1], pl, odd0, odd1);
        } else {
          // keys 2c, 2c + 1 of each 8-key group widen to one fp16 B register (k16 steps: groups 0, 1 and 2, 3).
          mma_f16_16816(acc[q][0], pa, widen_pair(vr[cur][0], 0x20), widen_pair(vr[cur][1], 0x20));
          mma_f16_16816(acc[q][1], pa, widen_pair(vr[cur][0], 0x31), widen_pair(vr[cur][1], 0x31));
          mma_f16_16816(acc[q][0], pl, widen_pair(vr[cur][2], 0x20), widen_pair(vr[cur][3], 0x20));
          mma_f16_16816(acc[q][1], pl, widen_pair(vr[cur][2], 0x31), widen_pair(vr[cur][3], 0x31));
        }
      }
    }
  }
  griddep_launch_dependents();  // the combine kernel may start its launch; it waits for this grid's writes
  cp_async_wait<0>();

  // Row sums: quad, then the 4 warps (all used the same maxima).
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    float l = row_sum[i];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    if (c == 0) sum_smem[warp * kRows + g + 8 * i] = l;
  }
  __syncthreads();
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int local = g + 8 * i;
    const int r = block_row0 + local;
    if (r >= rows) continue;
    float l = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) l += sum_smem[w * kRows + local];
    // l and P carry the same 2^kShift, so O / l needs no further shift.
    const float inv = l > 0.f ? p.out_scale / l : 0.f;
    const float lse2 = l > 0.f ? row_max[i] - kShift + __log2f(l) : -INFINITY;
    const int col0 = warp * kWarpCols + 4 * c;
    if (p.splits == 1) {
      __nv_bfloat16* out = static_cast<__nv_bfloat16*>(p.out) + (out_row0 + r) * kValueDim + col0;
#pragma unroll
      for (int q = 0; q < kColGroups; ++q) {
        uint2 v;
        v.x = pack_bf16x2(acc[q][0][2 * i] * inv, acc[q][1][2 * i] * inv);
        v.y = pack_bf16x2(acc[q][0][2 * i + 1] * inv, acc[q][1][2 * i + 1] * inv);
        *reinterpret_cast<uint2*>(out + 16 * q) = v;
      }
      if (p.lse != nullptr && warp == 0 && c == 0) p.lse[out_row0 + r] = lse2 * 0.6931471805599453f;
    } else {
      const int64_t slot = (static_cast<int64_t>(b) * p.splits + split) * rows + r;
      __nv_bfloat16* out = static_cast<__nv_bfloat16*>(p.part_o) + slot * kValueDim + col0;
#pragma unroll
      for (int q = 0; q < kColGroups; ++q) {
        uint2 v;
        v.x = pack_bf16x2(acc[q][0][2 * i] * inv, acc[q][1][2 * i] * inv);
        v.y = pack_bf16x2(acc[q][0][2 * i + 1] * inv, acc[q][1][2 * i + 1] * inv);
        *reinterpret_cast<uint2*>(out + 16 * q) = v;
      }
      if (warp == 0 && c == 0) p.part_lse[slot] = lse2;
    }
  }
}

}  // namespace kdtree
