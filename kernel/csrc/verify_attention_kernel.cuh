// DDTree verify attention for absorbed MLA (D = 576 keys, 512 values), plain CUDA, no torch.
//
// Work split. One block = one request x one block of up to 16*RG (token, head) rows x one KV chunk. Every
// row of the block (all heads and draft tokens it holds) shares each key tile it stages in shared memory,
// so a request's KV is read from DRAM once per chunk, not once per head. Small batches split the KV range
// into chunks (grid.y) and a combine kernel merges the partial softmaxes (LSE-weighted).
//
// Warp roles. A row group (16 rows) is served by four warps. For S = Q K^T they split the 576 dims (9
// k-steps each, Q held in registers), swap partial scores through shared memory and add them in a fixed
// order, so all four hold the same S and run the same online softmax. For O += P V each warp owns 128 of
// the 512 output columns (64 fp32 accumulators per thread). Up to 3 row groups (12 warps) per block keep
// registers under 170 per thread, and enough warps resident to hide ldmatrix/mma latency.
//
// Measured limit (H200, ncu): shared-memory traffic and issue, not DRAM or the tensor cores: every K/V byte
// is read by ldmatrix once per row group and the partial scores cross shared memory. See
// kernel/bench/results-h200.md and the issue note for the next step (keys on the MMA M side).
//
// Pipeline. STAGES shared-memory tiles of BN keys x 576 dims (rows padded by 16 bytes, so the 8 row reads of
// each ldmatrix hit distinct banks), filled by cp.async gathers STAGES - 1 tiles ahead. The pool rows a
// gather needs are themselves staged tiles earlier (cp.async into a small ring), so no thread ever waits
// on an index load before issuing its copies. Configs: BN=32 x 2 stages, BN=16 x 4 stages.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "mma_primitives.cuh"
#include "verify_attention.h"

namespace kdtree {

constexpr int kWarpsPerRowGroup = 4;
constexpr int kRowBytes = kHeadDim * 2 + 16;                 // padded shared-memory row of one key
constexpr int kChunksPerRow = kHeadDim * 2 / 16;             // 16-byte cp.async pieces per key row (72)
constexpr int kQkSteps = kHeadDim / 16 / kWarpsPerRowGroup;  // k-steps of 16 dims per warp (9)
constexpr int kOutCols = kValueDim / kWarpsPerRowGroup;      // output columns per warp (128)
constexpr int kOutTiles = kOutCols / 8;                      // n8 tiles per warp (16)
constexpr int kQkDims = kHeadDim / kWarpsPerRowGroup;        // dims of S = Q K^T per warp (144)
constexpr float kLn2 = 0.6931471805599453f;

// RG: 16-row groups per block. BN: keys per tile. STAGES: tiles in shared memory (STAGES - 1 in flight).
template <int RG, int BN, int STAGES>
struct TileConfig {
  static constexpr int kWarps = RG * kWarpsPerRowGroup;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kBlockM = RG * 16;
  static constexpr int kScoreTiles = BN / 8;
  static constexpr int kStageBytes = BN * kRowBytes;
  static constexpr int kExchangeBytes = kWarps * 32 * kScoreTiles * 16;
  // Ring of per-tile pool-row vectors, fetched 2 * STAGES - 2 tiles ahead of their use by the gathers.
  static constexpr int kIndexSlots = 2 * STAGES - 2;
  static constexpr int kIndexBytes = kIndexSlots * BN * 8;
  static constexpr int kSmemBytes = STAGES * kStageBytes + kExchangeBytes + kIndexBytes;
  static constexpr int kPiecesPerThread = (BN * kChunksPerRow + kThreads - 1) / kThreads;
};

static_assert(TileConfig<kMaxRowGroups, 32, 2>::kSmemBytes <= 99 * 1024, "BN=32 x 2 stages must fit 99 KB");
static_assert(TileConfig<kMaxRowGroups, 16, 4>::kSmemBytes <= 99 * 1024, "BN=16 x 4 stages must fit 99 KB");
static_assert(kHeadDim % (16 * kWarpsPerRowGroup) == 0, "head dim must split evenly across a row group's warps");

// Gathers one tile's key rows (pool rows already staged in shared memory) with 16-byte cp.async; rows past
// key_hi are zero-filled so that masked P (= 0) times V stays 0.
template <int RG, int BN, int STAGES, typename IdxT>
__device__ __forceinline__ void gather_tile(uint32_t stage, const __nv_bfloat16* kv, int64_t row_stride,
                                            const IdxT* rows, int tile_key0, int key_hi, int tid) {
  using Cfg = TileConfig<RG, BN, STAGES>;
#pragma unroll
  for (int i = 0; i < Cfg::kPiecesPerThread; ++i) {
    const int x = tid + i * Cfg::kThreads;
    if (Cfg::kThreads * Cfg::kPiecesPerThread == BN * kChunksPerRow || x < BN * kChunksPerRow) {
      const int row = x / kChunksPerRow;
      const int piece = x - row * kChunksPerRow;
      const bool live = tile_key0 + row < key_hi;
      const int64_t pool_row = live ? static_cast<int64_t>(rows[row]) : 0;
      cp_async_16(stage + row * kRowBytes + piece * 16, kv + pool_row * row_stride + piece * 8, live ? 16 : 0);
    }
  }
}

// Stages the pool rows of one tile (BN indices) into shared memory: lanes of warp 0, asynchronously.
template <int BN, typename IdxT>
__device__ __forceinline__ void fetch_tile_rows(uint32_t slot, const IdxT* indices, int tile_key0, int key_hi,
                                                int tid) {
  if (tid < BN) {
    const int key = tile_key0 + tid;
    const bool live = key < key_hi;
    cp_async_ca<sizeof(IdxT)>(slot + tid * sizeof(IdxT), indices + (live ? key : 0), live ? sizeof(IdxT) : 0);
  }
}

template <int RG, int BN, int STAGES, typename IdxT>
__global__ void __launch_bounds__(TileConfig<RG, BN, STAGES>::kThreads, 1)
    verify_attention_kernel(const VerifyParams p) {
  using Cfg = TileConfig<RG, BN, STAGES>;
  constexpr int kScoreTiles = Cfg::kScoreTiles;
  extern __shared__ __align__(128) unsigned char smem[];

  const int row_block = blockIdx.x;
  const int split = blockIdx.y;
  const int b = blockIdx.z;
  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int lane = tid % 32;
  const int group = warp / kWarpsPerRowGroup;  // row group of this warp
  const int part = warp % kWarpsPerRowGroup;   // which quarter of D (QK) and of the output columns (PV)
  const int g = lane / 4;                      // fragment row (and row + 8)
  const int c = lane % 4;                      // fragment column pair

  const int kv_begin = p.kv_indptr[b];
  const int kv_len = p.kv_indptr[b + 1] - kv_begin;
  const int prefix = kv_len - p.q_len;
  const int chunk = chunk_for(p, kv_len);
  const int key_lo = split * chunk;
  if (key_lo >= kv_len) return;  // this chunk lies past the request's keys (grid sized for the worst case)
  const int key_hi = min(kv_len, key_lo + chunk);
  const int n_tiles = (key_hi - key_lo + BN - 1) / BN;

  const IdxT* indices = static_cast<const IdxT*>(p.kv_indices) + kv_begin;
  const __nv_bfloat16* kv = static_cast<const __nv_bfloat16*>(p.kv);
  const uint32_t smem_base = smem_addr(smem);
  float* exchange = reinterpret_cast<float*>(smem + STAGES * Cfg::kStageBytes);
  const IdxT* index_ring = reinterpret_cast<const IdxT*>(smem + STAGES * Cfg::kStageBytes + Cfg::kExchangeBytes);
  const uint32_t index_base = smem_base + STAGES * Cfg::kStageBytes + Cfg::kExchangeBytes;
  constexpr int kSlotBytes = BN * 8;

  // Prologue: pool rows of tiles 0 .. 2*STAGES-3, then the gathers of tiles 0 .. STAGES-2 (one group each).
#pragma unroll
  for (int t = 0; t < Cfg::kIndexSlots; ++t) {
    fetch_tile_rows<BN, IdxT>(index_base + t * kSlotBytes, indices, key_lo + t * BN, key_hi, tid);
  }
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();
#pragma unroll
  for (int t = 0; t < STAGES - 1; ++t) {
    if (t < n_tiles) {
      gather_tile<RG, BN, STAGES, IdxT>(smem_base + t * Cfg::kStageBytes, kv, p.kv_row_stride,
                                        index_ring + t * (kSlotBytes / sizeof(IdxT)), key_lo + t * BN, key_hi, tid);
    }
    cp_async_commit();
  }

  const int rows = p.q_len * p.heads;
  const int q_tok0 = p.qo_indptr[b];
  const int warp_row0 = row_block * Cfg::kBlockM + group * 16;
  int token[2];
  bool row_live[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int r = warp_row0 + g + 8 * i;
    row_live[i] = r < rows;
    token[i] = row_live[i] ? r / p.heads : 0;
  }

  // Q fragments for this warp's 16 rows and its quarter of the 576 dims, held for the whole KV loop.
  uint32_t qf[kQkSteps][4];
  {
    const __nv_bfloat16* q = static_cast<const __nv_bfloat16*>(p.q);
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int r = warp_row0 + g + 8 * i;
      const int head = row_live[i] ? r - token[i] * p.heads : 0;
      const __nv_bfloat16* qrow =
          q + static_cast<int64_t>(q_tok0 + token[i]) * p.q_stride_token + head * p.q_stride_head;
#pragma unroll
      for (int ks = 0; ks < kQkSteps; ++ks) {
        const int d0 = part * kQkDims + ks * 16 + 2 * c;
        qf[ks][i] = row_live[i] ? __ldg(reinterpret_cast<const unsigned int*>(qrow + d0)) : 0u;
        qf[ks][i + 2] = row_live[i] ? __ldg(reinterpret_cast<const unsigned int*>(qrow + d0 + 8)) : 0u;
      }
    }
  }

  float acc[kOutTiles][4];
#pragma unroll
  for (int t = 0; t < kOutTiles; ++t) {
    acc[t][0] = acc[t][1] = acc[t][2] = acc[t][3] = 0.f;
  }
  float row_max[2] = {-INFINITY, -INFINITY};
  float row_sum[2] = {0.f, 0.f};

  for (int it = 0; it < n_tiles; ++it) {
    // Group of iteration j = gather of tile j + STAGES - 1 + pool rows of tile j + 2 * STAGES - 2. Waiting
    // for all but the newest STAGES - 2 groups lands tile `it` and the pool rows of tile it + STAGES - 1.
    cp_async_wait<STAGES - 2>();
    __syncthreads();              // ... for every thread; all warps are done with tile it - 1 and the exchange
    const int tile_key0 = key_lo + it * BN;
    {
      const int ahead = it + STAGES - 1;  // refill the stage tile it - 1 used
      if (ahead < n_tiles) {
        gather_tile<RG, BN, STAGES, IdxT>(smem_base + (ahead % STAGES) * Cfg::kStageBytes, kv, p.kv_row_stride,
                                          index_ring + (ahead % Cfg::kIndexSlots) * (kSlotBytes / sizeof(IdxT)),
                                          key_lo + ahead * BN, key_hi, tid);
      }
      const int rows_ahead = it + Cfg::kIndexSlots;  // its slot last served tile `it`, gathered long ago
      if (rows_ahead < n_tiles) {
        fetch_tile_rows<BN, IdxT>(index_base + (rows_ahead % Cfg::kIndexSlots) * kSlotBytes, indices,
                                  key_lo + rows_ahead * BN, key_hi, tid);
      }
      cp_async_commit();
    }
    const uint32_t stage = smem_base + (it % STAGES) * Cfg::kStageBytes;

    // Partial scores over this warp's quarter of D.
    float s[kScoreTiles][4];
#pragma unroll
    for (int t = 0; t < kScoreTiles; ++t) s[t][0] = s[t][1] = s[t][2] = s[t][3] = 0.f;
    {
      const int key_in_tile = (lane & 7) + (lane >> 4) * 8;
      const int dim_off = ((lane >> 3) & 1) * 8;
      const uint32_t base = stage + key_in_tile * kRowBytes + (part * kQkDims + dim_off) * 2;
#pragma unroll
      for (int ks = 0; ks < kQkSteps; ++ks) {
#pragma unroll
        for (int pair = 0; pair < kScoreTiles / 2; ++pair) {
          uint32_t b0, b1, b2, b3;
          ldmatrix_x4(base + pair * 16 * kRowBytes + ks * 32, b0, b1, b2, b3);
          mma_bf16_16816(s[2 * pair], qf[ks], b0, b1);
          mma_bf16_16816(s[2 * pair + 1], qf[ks], b2, b3);
        }
      }
    }

    // Swap partial scores within the row group and add them in warp order, so that all four warps hold
    // bit-identical full scores (and run the same online softmax).
    {
      float4* mine = reinterpret_cast<float4*>(exchange) + warp * 32 * kScoreTiles;
#pragma unroll
      for (int t = 0; t < kScoreTiles; ++t) mine[t * 32 + lane] = make_float4(s[t][0], s[t][1], s[t][2], s[t][3]);
      named_barrier(1 + group, 32 * kWarpsPerRowGroup);
      const float4* peers = reinterpret_cast<const float4*>(exchange) + group * kWarpsPerRowGroup * 32 * kScoreTiles;
#pragma unroll
      for (int t = 0; t < kScoreTiles; ++t) {
        const float4 own = make_float4(s[t][0], s[t][1], s[t][2], s[t][3]);
        float4 sum = part == 0 ? own : peers[t * 32 + lane];
#pragma unroll
        for (int w = 1; w < kWarpsPerRowGroup; ++w) {
          // A warp's own partial comes from registers (the same bits it stored), the others from smem.
          const float4 o = w == part ? own : peers[(w * kScoreTiles + t) * 32 + lane];
          sum.x += o.x;
          sum.y += o.y;
          sum.z += o.z;
          sum.w += o.w;
        }
        s[t][0] = sum.x;
        s[t][1] = sum.y;
        s[t][2] = sum.z;
        s[t][3] = sum.w;
      }
    }

    // Mask (raw scores): keys past the chunk, and drafts the tree hides from this row.
    if (tile_key0 + BN > prefix || tile_key0 + BN > key_hi) {
#pragma unroll
      for (int t = 0; t < kScoreTiles; ++t) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int key = tile_key0 + t * 8 + 2 * c + (e & 1);
          bool visible = key < key_hi;
          if (visible && key >= prefix) {
            const int j = key - prefix;
            const uint64_t* mask_row = p.draft_mask + static_cast<int64_t>(q_tok0 + token[e >> 1]) * p.mask_words;
            visible = (__ldg(reinterpret_cast<const unsigned long long*>(mask_row) + (j >> 6)) >> (j & 63)) & 1ull;
          }
          if (!visible) s[t][e] = -INFINITY;
        }
      }
    }

    // Online softmax over this tile (rows g and g + 8; a row's BN columns live in the 4 lanes of a quad).
    // Running maxima are kept in the scaled log2 domain; the scale (> 0) is folded into one FFMA per score.
    float alpha[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      float raw = -INFINITY;
#pragma unroll
      for (int t = 0; t < kScoreTiles; ++t) raw = fmaxf(raw, fmaxf(s[t][2 * i], s[t][2 * i + 1]));
      raw = fmaxf(raw, __shfl_xor_sync(0xffffffffu, raw, 1));
      raw = fmaxf(raw, __shfl_xor_sync(0xffffffffu, raw, 2));
      const float mx = fmaxf(row_max[i], raw * p.scale_log2);
      const float base = mx == -INFINITY ? 0.f : mx;  // a row with nothing visible yet stays at zero weight
      alpha[i] = fast_exp2(row_max[i] - base);
      row_max[i] = mx;
      float sum = 0.f;
#pragma unroll
      for (int t = 0; t < kScoreTiles; ++t) {
        s[t][2 * i] = fast_exp2(fmaf(s[t][2 * i], p.scale_log2, -base));
        s[t][2 * i + 1] = fast_exp2(fmaf(s[t][2 * i + 1], p.scale_log2, -base));
        sum += s[t][2 * i] + s[t][2 * i + 1];
      }
      row_sum[i] = row_sum[i] * alpha[i] + sum;
    }
    // Rescale the accumulators only when some row's maximum moved (rare once the prefix max is found).
    if (__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) {
#pragma unroll
      for (int t = 0; t < kOutTiles; ++t) {
        acc[t][0] *= alpha[0];
        acc[t][1] *= alpha[0];
        acc[t][2] *= alpha[1];
        acc[t][3] *= alpha[1];
      }
    }

    // O += P V over this warp's 128 output columns; P goes from score accumulators straight to A fragments.
    {
      const int key_in_tile = (lane & 7) + ((lane >> 3) & 1) * 8;
      const int col_off = (lane >> 4) * 8;
      const uint32_t base = stage + key_in_tile * kRowBytes + (part * kOutCols + col_off) * 2;
#pragma unroll
      for (int kk = 0; kk < BN / 16; ++kk) {
        const uint32_t pa[4] = {pack_bf16x2(s[2 * kk][0], s[2 * kk][1]), pack_bf16x2(s[2 * kk][2], s[2 * kk][3]),
                                pack_bf16x2(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                                pack_bf16x2(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
        for (int pair = 0; pair < kOutTiles / 2; ++pair) {
          uint32_t b0, b1, b2, b3;
          ldmatrix_x4_trans(base + kk * 16 * kRowBytes + pair * 32, b0, b1, b2, b3);
          mma_bf16_16816(acc[2 * pair], pa, b0, b1);
          mma_bf16_16816(acc[2 * pair + 1], pa, b2, b3);
        }
      }
    }
  }
  cp_async_wait<0>();  // leave no copy in flight into shared memory of an exiting block

  // Epilogue: finish the row sums across the quad, normalise, write the output or this chunk's partial.
  const int out_row0 = q_tok0 * p.heads;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    float l = row_sum[i];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    const float inv = l > 0.f ? 1.f / l : 0.f;
    const float lse2 = l > 0.f ? row_max[i] + __log2f(l) : -INFINITY;
    const int r = warp_row0 + g + 8 * i;
    if (!row_live[i]) continue;
    if (p.splits == 1) {
      __nv_bfloat16* out = static_cast<__nv_bfloat16*>(p.out) + static_cast<int64_t>(out_row0 + r) * kValueDim +
                           part * kOutCols + 2 * c;
#pragma unroll
      for (int t = 0; t < kOutTiles; ++t) {
        *reinterpret_cast<uint32_t*>(out + t * 8) = pack_bf16x2(acc[t][2 * i] * inv, acc[t][2 * i + 1] * inv);
      }
      if (p.lse != nullptr && part == 0 && c == 0) p.lse[out_row0 + r] = lse2 * kLn2;
    } else {
      const int64_t slot = (static_cast<int64_t>(b) * p.splits + split) * rows + r;
      float* out = p.part_o + slot * kValueDim + part * kOutCols + 2 * c;
#pragma unroll
      for (int t = 0; t < kOutTiles; ++t) {
        *reinterpret_cast<float2*>(out + t * 8) = make_float2(acc[t][2 * i] * inv, acc[t][2 * i + 1] * inv);
      }
      if (part == 0 && c == 0) p.part_lse[slot] = lse2;
    }
  }
}

}  // namespace kdtree
