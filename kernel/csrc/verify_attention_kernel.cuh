// DDTree verify attention for absorbed MLA (D = 576 keys, 512 values), plain CUDA, no torch.
// The experiments behind these choices, with their numbers: docs/kernel-notes.md.
//
// Work split. One block = one request x up to 16*RG (token, head) rows x one KV chunk. Every row of the block
// (all heads and draft tokens it holds) shares each key tile it stages in shared memory, so a request's KV is
// read from DRAM once per chunk, not once per head. Small batches split the KV range into chunks (grid.y) and
// a combine kernel merges the partial softmaxes (LSE-weighted).
//
// Warp roles (warp-specialised, so no warp holds both a row block's Q and an O tile in registers):
// - 2 * RG score warps. A pair owns 16 rows; each keeps half of their 576-dim Q in registers (so K is the only
//   shared-memory operand of S = Q K^T), computes the partial scores over its half, and the pair swaps them
//   through shared memory and adds them, so both hold the same S and find the same row maxima. Each then
//   exponentiates its own 8 keys of the tile (half of P, bf16, and of the row sums, which the pair adds after
//   the loop); one writes the rows' rescale factors.
// - 8 value warps. Each owns 64 of the 512 output columns for all 16*RG rows; one V fragment it loads serves
//   RG row tiles, and P arrives through ldmatrix. The value warps also issue the gathers.
// The two roles run one tile apart: in step `it` the score warps work on tile it while the value warps
// finish tile it - 1; P and the rescale factors are double-buffered.
// The 48-row block places the roles in one of two layouts (score_slot): mixed on every scheduler, or split
// (score warps alone on schedulers 2 and 3), which the planner picks for chunks of 1024 keys or more.
//
// Bottleneck (H200, measured): neither DRAM nor the shared-memory pipe; the warps' dependent chains within a
// 16-key step (~1630 cycles), with the tensor pipe ~36% busy and 0.5 eligible warps per scheduler. Both roles
// are near-critical, memory latency is covered, and the register file (Q and O of 48 rows) allows one block
// per SM.
//
// Pipeline. STAGES shared-memory tiles of kBlockN keys x 576 dims (rows swizzled, see swizzled_piece, so the
// 8 row reads of each ldmatrix hit distinct banks): tile it - 1 (value warps), tile it (score warps), and the next
// STAGES - 2 tiles in flight as cp.async gathers (stages_for: 4 for the 48-row block, 5 for the smaller ones, one
// config for sm_90 and sm_120). The pool rows a gather needs are staged STAGES - 2 steps earlier (cp.async into a
// ring), so no thread waits on an index load before issuing its copies.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "mma_primitives.cuh"
#include "verify_attention.h"
#include "verify_attention_rows.cuh"

namespace kdtree {

constexpr int kBlockN = 16;                                // keys per tile (one k-step of P V)
constexpr int kValueWarps = 8;                             // warps of the P V role
constexpr int kValueCols = kValueDim / kValueWarps;        // output columns per value warp (64)
constexpr int kValueTiles = kValueCols / 8;                // n8 tiles per value warp (8)
constexpr int kQkSteps = kHeadDim / 16;                    // k-steps of S = Q K^T (36)
constexpr int kScoreHalves = 2;                            // score warps per 16 rows (each owns half the dims)
constexpr int kHalfSteps = kQkSteps / kScoreHalves;        // k-steps (and Q registers / 4) per score warp (18)
constexpr int kFragAhead = 2;                              // k-steps a score warp loads its fragments ahead
constexpr int kQkChains = 2;                               // independent accumulator sets per score tile
constexpr int kRowBytes = kHeadDim * 2;                    // shared-memory row of one key (9 x 128 bytes)
constexpr int kChunksPerRow = kHeadDim * 2 / 16;           // 16-byte cp.async pieces per key row (72)
constexpr int kPRowBytes = kBlockN * 2 + 16;               // padded row of P (ldmatrix conflict-free)
constexpr int kGatherLanesPerRow = 8;                      // threads that copy one key row (9 pieces each)
constexpr int kGatherThreads = kBlockN * kGatherLanesPerRow;  // value threads that issue the gathers (128)
static_assert(kGatherLanesPerRow == 8, "a copy lane owns one 16-byte piece of every 128-byte line of its row");
static_assert(kHeadDim % 64 == 0, "each score warp of a pair takes two of the four k-steps of every 128-byte line");
static_assert(kGatherThreads <= kValueWarps * 32, "the value warps must cover a tile's gathers");
constexpr float kLn2 = 0.6931471805599453f;
// Lazy running maximum (scaled log2 domain): a row's maximum moves only when a tile's exceeds it by more than this,
// so P stays below 2^8 (bf16 and fp16 hold that with the same relative precision as P <= 1; row sums and O are
// fp32). An eager maximum moves a row at tile t with probability ~1/t on random scores, and a value warp rescales
// a row tile (32 FMUL) when any of its 16 rows moved: on most tiles of a chunk. Lagging by up to 2^8 leaves a
// handful of moves a chunk; measured 2-7% faster from 32 rows up (kernel/bench/results/h200/ab.md AJ).
constexpr float kLazyMaxLog2 = 8.f;

// FP8 KV (SGLang --kv-cache-dtype fp8_e4m3: float8_e4m3fn rows, keys = row * k_scale, values = row[:512] *
// v_scale). The value threads gather the raw rows (576 bytes, half the bf16 bytes) into a ring of kRawSlots
// tiles, kRawAhead tiles ahead, and one step before the score warps need a tile they widen it to fp16 in its
// shared-memory stage (exact: every e4m3 value is an fp16 value); from there the block runs as for bf16, with
// fp16 mma. Q is rounded to fp16 after a 2^-kFp8QShift prescale that the softmax scale undoes: fp16's range then
// covers |q| up to 1.6e7, and bf16 Q values are exact in fp16 down to |q| = 2^-6 (below that the absolute
// error is under 2^-17). P is rounded to fp16 (more mantissa than bf16 for P in [0, 2^8], kLazyMaxLog2). So the
// fp8 path computes the same function as the bf16 one does on the dequantized pool, to fp16 / fp32 rounding.
// Stages: tile it - 1 (value warps), it (score warps), it + 1 (being widened): 3 fp16 stages, 3 raw slots.
constexpr int kFp8Stages = 3;
constexpr int kRawAhead = 2;                               // raw tiles in flight beyond the one being widened
constexpr int kRawSlots = kRawAhead + 1;
constexpr int kRawRowBytes = kHeadDim;                     // 576: one e4m3 key row
constexpr int kRawPieces = kRawRowBytes / 16;              // 16-byte pieces of a raw row (36)
constexpr int kValueBarrier = 1 + 3;                       // value threads only (ids 1..RG are the score pairs)

// Key rows sit unpadded in shared memory, 128-byte aligned, with the eight 16-byte pieces of each 128-byte line
// permuted by the row's index mod 8 (XOR). The 8 rows one ldmatrix reads at the same logical piece then hit 8
// distinct bank groups, and every gather writes whole aligned 128-byte lines. (Padded rows, the previous layout,
// left cp.async writing lines that straddle 128-byte boundaries: ncu counted 2.6x the ideal shared-memory
// wavefronts for the gathers, 1.0x now.) Byte offset, within its key row, of logical piece `piece` of row `row`:
__device__ __forceinline__ uint32_t swizzled_piece(int piece, int row) {
  return static_cast<uint32_t>(piece ^ (row & 7)) * 16;
}

// Warp roles. Scheduler s of an SM issues for warps s, s + 4, ... (warp % 4). Two layouts of the RG = 3 block:
// - mixed (14 warps): score warps (36 mma per step each) and value warps (8 * RG) share the schedulers so that
//   each gets near-equal tensor work: score warps {0, 1, 2, 3, 6, 7} give 108 / 108 / 96 / 96 mma per step.
// - split (kSplit, 16 warps, two of them idle): schedulers 2 and 3 carry only score warps (2, 6, 10 / 3, 7, 11:
//   108 mma per step each, the two halves of a pair on different schedulers), schedulers 0 and 1 only value warps
//   (96 mma each) and every gather. Faster where a block runs 64 or more tiles, slower on short chunks (bs = 1),
//   so the planner picks it by chunk length (plan.py).
// RG = 1 puts its two score warps on schedulers 2 and 3 as well. Returns the warp's index within its role, or -1.
template <int RG, bool kSplit>
__device__ __forceinline__ int score_slot(int warp) {
  if constexpr (RG == 1) return warp == 2 || warp == 3 ? warp - 2 : -1;
  if constexpr (RG == 3 && kSplit) return warp % 4 >= 2 && warp < 12 ? (warp / 4) * 2 + warp % 4 - 2 : -1;
  if constexpr (RG == 3) return warp < 4 ? warp : (warp == 6 || warp == 7 ? warp - 2 : -1);
  return warp < 2 * RG ? warp : -1;
}
template <int RG, bool kSplit>
__device__ __forceinline__ int value_slot(int warp) {
  if constexpr (RG == 1) return warp < 2 ? warp : warp - 2;
  if constexpr (RG == 3 && kSplit) return warp % 4 < 2 ? (warp / 4) * 2 + warp % 4 : -1;
  if constexpr (RG == 3) return warp < 6 ? warp - 4 : warp - 6;
  return warp - 2 * RG;
}

static_assert(kQkSteps % kScoreHalves == 0, "the dims must split evenly across a row tile's score warps");
static_assert(kBlockN == 16, "the P V step and the P layout assume one 16-key k-step per tile");

template <int RG, int STAGES, bool kFp8 = false>
struct TileConfig {
  static_assert(STAGES >= 3, "tiles it - 1 and it are in use while at least one more is in flight");
  static constexpr int kKStages = kFp8 ? kFp8Stages : STAGES;  // 16-bit key tiles in shared memory
  // Steps between a tile's gather and the step whose score warps read it, and the cp.async groups a value
  // thread may leave in flight at a step's barrier (bf16: tile it has landed; fp8: raw tile it + 1 has).
  static constexpr int kAhead = kFp8 ? kRawAhead + 1 : STAGES - 2;
  static constexpr int kPending = kFp8 ? kRawAhead - 1 : STAGES - 3;
  // Ring of per-tile pool-row vectors: the rows of tile it + kIndexSlots are fetched at step it, and must have
  // landed (kPending groups later) before that tile's gather, kIndexSlots - kAhead steps on.
  static constexpr int kIndexSlots = kFp8 ? 2 * kRawAhead + 2 : 2 * STAGES - 4;
  static_assert(kIndexSlots - kAhead >= kPending + 1, "pool rows must land before their gather");
  static constexpr int kScoreWarps = RG * kScoreHalves;
  static constexpr int kWarps = kScoreWarps + kValueWarps;
  static constexpr int kThreads = kWarps * 32;  // the working threads, which meet at the block barriers
  static constexpr int kBlockM = RG * 16;
  static constexpr int kStageBytes = kBlockN * kRowBytes;
  static constexpr int kRawBytes = kBlockN * kRawRowBytes;  // one raw fp8 tile (fp8 only)
  static constexpr int kRawOffset = kKStages * kStageBytes;
  static constexpr int kPBufBytes = kBlockM * kPRowBytes;
  static constexpr int kPOffset = kRawOffset + (kFp8 ? kRawSlots * kRawBytes : 0);
  static constexpr int kAlphaOffset = kPOffset + 2 * kPBufBytes;     // float [2][kBlockM], rows g, g + 8 paired
  static constexpr int kStatsOffset = kAlphaOffset + 2 * kBlockM * 4;  // float [kBlockM]: 1 / row sum
  static constexpr int kPairSumOffset = kStatsOffset + kBlockM * 4;  // float [kBlockM]: half 1's row sums
  static constexpr int kExchangeOffset = kPairSumOffset + kBlockM * 4;  // float4 [RG][halves][2][32]: partial S
  static constexpr int kIndexOffset = kExchangeOffset + RG * kScoreHalves * 2 * 32 * 16;
  static constexpr int kSmemBytes = kIndexOffset + kIndexSlots * kBlockN * 8;
};

// Threads a block launches: the working ones (those the block barriers count), plus the split layout's two idle
// warps.
template <int RG, bool kSplit>
constexpr int launch_threads() {
  return TileConfig<RG, stages_for(RG)>::kThreads + (RG == 3 && kSplit ? 2 * 32 : 0);
}

static_assert(TileConfig<1, stages_for(1)>::kSmemBytes <= 99 * 1024, "every block must fit sm_120's 99 KB");
static_assert(TileConfig<2, stages_for(2)>::kSmemBytes <= 99 * 1024, "every block must fit sm_120's 99 KB");
static_assert(TileConfig<3, stages_for(3)>::kSmemBytes <= 99 * 1024, "every block must fit sm_120's 99 KB");
static_assert(TileConfig<kMaxRowGroups, stages_for(kMaxRowGroups), true>::kSmemBytes <= 99 * 1024, "the fp8 block too");
static_assert(kValueBarrier > kMaxRowGroups && kValueBarrier < 16, "a barrier id of its own");

// Gathers one tile's key rows (pool rows already staged in shared memory) with 16-byte cp.async. Issued by
// the first kGatherThreads value threads (vtid = index among the value threads): 8 lanes per key row, each
// copying every 8th 16-byte piece, so one warp instruction moves 4 whole 128-byte lines and a thread needs
// one index load and one 64-bit address per tile (the addresses of its 9 pieces differ by constants). Rows
// past key_hi are zero-filled so that masked P (= 0) times V stays 0.
template <typename IdxT>
__device__ __forceinline__ void gather_tile(uint32_t stage, const __nv_bfloat16* kv, int64_t row_stride,
                                            const IdxT* rows, int tile_key0, int key_hi, int vtid) {
  if (vtid >= kGatherThreads) return;
  const int row = vtid / kGatherLanesPerRow;
  const int lane = vtid % kGatherLanesPerRow;
  const bool live = tile_key0 + row < key_hi;
  const int64_t pool_row = live ? static_cast<int64_t>(rows[row]) : 0;
  const __nv_bfloat16* src = kv + pool_row * row_stride + lane * 8;
  const uint32_t dst = stage + row * kRowBytes + swizzled_piece(lane, row);
  const int bytes = live ? 16 : 0;
#pragma unroll
  for (int j = 0; j < kChunksPerRow / kGatherLanesPerRow; ++j) {
    cp_async_16(dst + j * 128, src + j * kGatherLanesPerRow * 8, bytes);
  }
}

// Stages the pool rows of one tile (kBlockN indices) into shared memory, asynchronously (value threads).
template <typename IdxT>
__device__ __forceinline__ void fetch_tile_rows(uint32_t slot, const IdxT* indices, int tile_key0, int key_hi,
                                                int vtid) {
  if (vtid < kBlockN) {
    const int key = tile_key0 + vtid;
    const bool live = key < key_hi;
    cp_async_ca<sizeof(IdxT)>(slot + vtid * sizeof(IdxT), indices + (live ? key : 0), live ? sizeof(IdxT) : 0);
  }
}

// FP8: gathers one tile's raw e4m3 key rows (576 bytes, unswizzled, back to back) into a raw slot. Same
// threads and lanes as gather_tile; a lane copies pieces lane, lane + 8, ... of its row (36 per row).
template <typename IdxT>
__device__ __forceinline__ void gather_raw_tile(uint32_t slot, const unsigned char* kv, int64_t row_stride,
                                                const IdxT* rows, int tile_key0, int key_hi, int vtid) {
  if (vtid >= kGatherThreads) return;
  const int row = vtid / kGatherLanesPerRow;
  const int lane = vtid % kGatherLanesPerRow;
  const bool live = tile_key0 + row < key_hi;
  const int64_t pool_row = live ? static_cast<int64_t>(rows[row]) : 0;
  const unsigned char* src = kv + pool_row * row_stride + lane * 16;
  const uint32_t dst = slot + row * kRawRowBytes + lane * 16;
  const int bytes = live ? 16 : 0;
#pragma unroll
  for (int j = 0; j < (kRawPieces + kGatherLanesPerRow - 1) / kGatherLanesPerRow; ++j) {
    if (lane + j * kGatherLanesPerRow < kRawPieces) cp_async_16(dst + j * 128, src + j * 128, bytes);
  }
}

// FP8: widens a landed raw tile into a 16-bit key stage (swizzled rows, as gather_tile writes them), all value
// threads: each takes 16 e4m3 dims of one key (a 16-byte shared load) and stores 32 bytes of fp16. Rows past
// the chunk were zero-filled, so they widen to zeros (P V needs finite values there).
__device__ __forceinline__ void widen_tile(const unsigned char* raw, unsigned char* stage, int vtid) {
  for (int i = vtid; i < kBlockN * kRawPieces; i += kValueWarps * 32) {
    const int row = i / kRawPieces;
    const int piece = i % kRawPieces;  // dims 16 * piece .. + 15: fp16 pieces 2 * piece, 2 * piece + 1
    const uint4 v = *reinterpret_cast<const uint4*>(raw + i * 16);
    const uint2 a = e4m3x4_to_f16x4(v.x);
    const uint2 b = e4m3x4_to_f16x4(v.y);
    const uint2 c = e4m3x4_to_f16x4(v.z);
    const uint2 d = e4m3x4_to_f16x4(v.w);
    unsigned char* line = stage + row * kRowBytes + (piece / 4) * 128;
    const int p0 = (2 * piece) % 8;
    *reinterpret_cast<uint4*>(line + swizzled_piece(p0, row)) = make_uint4(a.x, a.y, b.x, b.y);
    *reinterpret_cast<uint4*>(line + swizzled_piece(p0 + 1, row)) = make_uint4(c.x, c.y, d.x, d.y);
  }
}

// The dims of a score pair: in every 128-byte line (4 k-steps of 16 dims) warp `half` takes k-steps 2 * half
// and 2 * half + 1, so its local k-step m is global k-step 4 * (m / 2) + 2 * half + m % 2 (load_q_fragments reads
// Q's dims in that order). k_lane[e] is this lane's ldmatrix offset, within a stage, of piece pair e of line 0
// (line q adds q * 128): lanes 0-7 and 16-23 read the first 8 dims, 8-15 and 24-31 the next 8, of keys lane % 8
// (+ 8 for lanes 16-31).
__device__ __forceinline__ void score_k_lanes(int half, int lane, uint32_t (&k_lane)[2]) {
  const int key = (lane & 7) + (lane >> 4) * 8;
  const int hi = (lane >> 3) & 1;
#pragma unroll
  for (int e = 0; e < 2; ++e) k_lane[e] = key * kRowBytes + swizzled_piece(4 * half + 2 * e + hi, key);
}

// Score role, one tile: S = Q K^T for 16 rows x 16 keys, tree mask, online softmax; P and the rows' rescale
// factors go to shared memory for the value warps.
struct ScoreState {
  float row_max[2];  // running maxima, scaled log2 domain
  float row_sum[2];  // running sums of this lane's columns among the warp's own 8 keys of each tile
};

template <bool kF16>
__device__ __forceinline__ void score_tile(const VerifyParams& p, const uint32_t (&qf)[kHalfSteps][4],
                                          const uint32_t (&k_lane)[2], int half, float4* exchange,
                                          int pair_barrier, ScoreState& st, uint32_t stage, unsigned char* p_buf,
                                          float* alpha_buf,
                                          int local_row0, int tile_key0, int key_hi, int prefix, int q_tok0,
                                          const int (&token)[2], int lane) {
  const int g = lane / 4;
  const int c = lane % 4;
  float s[kQkChains][2][4];
#pragma unroll
  for (int k = 0; k < kQkChains; ++k) {
#pragma unroll
    for (int t = 0; t < 2; ++t) s[k][t][0] = s[k][t][1] = s[k][t][2] = s[k][t][3] = 0.f;
  }
  {
    // Fragments are loaded kFragAhead k-steps before their mma (ldmatrix and mma are volatile asm, so the
    // compiler keeps their order: without this each k-step would wait out a full ldmatrix latency).
    // Local k-step m is line m / 2, piece pair m % 2 of this warp's half (see score_k_lanes).
    uint32_t kb[kFragAhead + 1][4];
#pragma unroll
    for (int ks = 0; ks < kHalfSteps + kFragAhead; ++ks) {
      if (ks < kHalfSteps) {
        const int slot = ks % (kFragAhead + 1);
        ldmatrix_x4(stage + k_lane[ks % 2] + (ks / 2) * 128, kb[slot][0], kb[slot][1], kb[slot][2], kb[slot][3]);
      }
      const int m = ks - kFragAhead;  // the k-step whose mma issues now
      if (m >= 0) {
        const int slot = m % (kFragAhead + 1);
        mma_16816<kF16>(s[m % kQkChains][0], qf[m], kb[slot][0], kb[slot][1]);
        mma_16816<kF16>(s[m % kQkChains][1], qf[m], kb[slot][2], kb[slot][3]);
      }
    }
  }
#pragma unroll
  for (int k = 1; k < kQkChains; ++k) {
#pragma unroll
    for (int t = 0; t < 2; ++t) {
#pragma unroll
      for (int e = 0; e < 4; ++e) s[0][t][e] += s[k][t][e];
    }
  }
  float(&sc)[2][4] = s[0];
  // Swap the half-dim partial scores with the other warp of the pair; both add the two (fp32 addition commutes,
  // so they hold bit-identical scores and find the same row maxima). Each then exponentiates its own 8 keys.
  {
    float4* mine = exchange + half * 64;
    mine[lane] = make_float4(sc[0][0], sc[0][1], sc[0][2], sc[0][3]);
    mine[32 + lane] = make_float4(sc[1][0], sc[1][1], sc[1][2], sc[1][3]);
    named_barrier(pair_barrier, 32 * kScoreHalves);
    const float4* other = exchange + (1 - half) * 64;
#pragma unroll
    for (int t = 0; t < 2; ++t) {
      const float4 o = other[t * 32 + lane];
      sc[t][0] += o.x;
      sc[t][1] += o.y;
      sc[t][2] += o.z;
      sc[t][3] += o.w;
    }
  }

  // Mask (raw scores): keys past the chunk, and drafts the tree hides from this row.
  if (tile_key0 + kBlockN > prefix || tile_key0 + kBlockN > key_hi) {
#pragma unroll
    for (int t = 0; t < 2; ++t) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = tile_key0 + t * 8 + 2 * c + (e & 1);
        bool visible = key < key_hi;
        if (visible && key >= prefix) {
          const int j = key - prefix;
          const uint64_t* mask_row = p.draft_mask + static_cast<int64_t>(q_tok0 + token[e >> 1]) * p.mask_words;
          visible = (__ldg(reinterpret_cast<const unsigned long long*>(mask_row) + (j >> 6)) >> (j & 63)) & 1ull;
        }
        if (!visible) sc[t][e] = -INFINITY;
      }
    }
  }

  // Online softmax (rows g and g + 8; a row's 16 columns live in the 4 lanes of a quad). Maxima are kept in
  // the scaled log2 domain; the scale (> 0) is folded into one FFMA per score.
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    float raw = fmaxf(fmaxf(sc[0][2 * i], sc[0][2 * i + 1]), fmaxf(sc[1][2 * i], sc[1][2 * i + 1]));
    raw = fmaxf(raw, __shfl_xor_sync(0xffffffffu, raw, 1));
    raw = fmaxf(raw, __shfl_xor_sync(0xffffffffu, raw, 2));
    const float tile_max = raw * p.scale_log2;
    // kLazyMaxLog2: the maximum lags. -inf + 8 is -inf, so a row's first visible tile always sets it.
    const float mx = tile_max > st.row_max[i] + kLazyMaxLog2 ? tile_max : st.row_max[i];
    const float base = mx == -INFINITY ? 0.f : mx;  // a row with nothing visible yet stays at zero weight
    const float alpha = fast_exp2(st.row_max[i] - base);
    st.row_max[i] = mx;
    // This warp's 8 keys of the tile (n8 tile `half`): its half of P and of the row sum.
    const float e0 = fast_exp2(fmaf(half == 0 ? sc[0][2 * i] : sc[1][2 * i], p.scale_log2, -base));
    const float e1 = fast_exp2(fmaf(half == 0 ? sc[0][2 * i + 1] : sc[1][2 * i + 1], p.scale_log2, -base));
    st.row_sum[i] = st.row_sum[i] * alpha + (e0 + e1);
    const int row = local_row0 + g + 8 * i;
    if (c == 0 && half == 0) alpha_buf[local_row0 + 2 * g + i] = alpha;  // rows g, g + 8 side by side
    *reinterpret_cast<uint32_t*>(p_buf + row * kPRowBytes + (half * 8 + 2 * c) * 2) = pack_16x2<kF16>(e0, e1);
  }
}

// Score role, prologue: Q of this warp's 16 rows and half of the dims into mma A fragments (72 registers a
// thread, kept for the whole KV loop), rows past `rows` zero. Each lane loads whole 16-byte pieces (18 load
// instructions a warp, each reading 8 rows x 64 bytes) and the fragments come back through a 1 KB scratch with
// ldmatrix. Loading the fragments' 4-byte words directly (144 load instructions a warp, each touching 8 rows) held
// up the first key tile's gathers, which share the load path: on the H200 a bs 1 block's first tile landed 1.3-2.0
// us later, and bs 1 q 9 calls were 6-17% slower (kernel/bench/trace_phases.py, ab.md AH).
// Segment j of a row (dims 64 j + 32 half .. + 31: local k-steps 2 j and 2 j + 1, see score_k_lanes) is 4 pieces;
// lane l loads piece l % 4 of rows l / 4 and l / 4 + 8. The scratch holds one segment of the 16 rows, 64 bytes a
// row, pieces XOR-swizzled by (row / 2) % 4 so that ldmatrix's 8 row reads hit distinct banks.
template <bool kF16>
__device__ __forceinline__ void load_q_fragments(const VerifyParams& p, uint32_t (&qf)[kHalfSteps][4],
                                                 unsigned char* scratch, int row0, int rows, int q_tok0, int half,
                                                 int lane) {
  constexpr int kSegments = kHalfSteps / 2;
  const __nv_bfloat16* q = static_cast<const __nv_bfloat16*>(p.q);
  const int piece = lane % 4;
  uint4 seg[kSegments][2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int local = lane / 4 + 8 * i;
    const int r = row0 + local;
    const bool live = r < rows;
    const int token = live ? r / p.heads : 0;
    const int head = live ? r - token * p.heads : 0;
    const __nv_bfloat16* qrow = q + static_cast<int64_t>(q_tok0 + token) * p.q_stride_token +
                                head * p.q_stride_head + 32 * half + 8 * piece;
#pragma unroll
    for (int j = 0; j < kSegments; ++j) {
      seg[j][i] = live ? __ldg(reinterpret_cast<const uint4*>(qrow + 64 * j)) : make_uint4(0u, 0u, 0u, 0u);
    }
  }
  const uint32_t scratch_addr = smem_addr(scratch);
  const int ld_row = (lane & 7) + ((lane >> 3) & 1) * 8;  // ldmatrix x4: rows 0-15, then dims 8-15 (lanes 16-31)
#pragma unroll
  for (int j = 0; j < kSegments; ++j) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int local = lane / 4 + 8 * i;
      *reinterpret_cast<uint4*>(scratch + local * 64 + ((piece ^ ((local >> 1) & 3)) * 16)) = seg[j][i];
    }
    __syncwarp();
#pragma unroll
    for (int s = 0; s < 2; ++s) {
      const int pc = 2 * s + (lane >> 4);
      uint32_t(&a)[4] = qf[2 * j + s];
      ldmatrix_x4(scratch_addr + ld_row * 64 + ((pc ^ ((ld_row >> 1) & 3)) * 16), a[0], a[1], a[2], a[3]);
      if constexpr (kF16) {
        constexpr float kQScale = 1.f / (1 << kFp8QShift);  // undone by p.scale_log2 (binding)
#pragma unroll
        for (int e = 0; e < 4; ++e) a[e] = bf16x2_to_f16x2(a[e], kQScale);
      }
    }
    __syncwarp();  // the next segment overwrites the scratch
  }
}

template <int RG, int STAGES, typename IdxT, bool kSplit, bool kFp8>
__global__ void __launch_bounds__(launch_threads<RG, kSplit>(), 1)
    verify_attention_kernel(const VerifyParams p) {
  using Cfg = TileConfig<RG, STAGES, kFp8>;
  extern __shared__ __align__(128) unsigned char smem[];

  const int row_block = blockIdx.x;
  const int split = blockIdx.y;
  const int b = blockIdx.z;
  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int lane = tid % 32;
  const int g = lane / 4;  // fragment row (and row + 8)
  const int c = lane % 4;  // fragment column pair

  griddep_wait();  // launched as a programmatic dependent: the previous kernel's writes are visible from here
  // The request's index entries (qo_indptr and both kv_indptr ends) load together at entry: one round trip for
  // the three. Loaded after the prologue barrier, as before, qo_indptr was one more trip in front of the score
  // warps' Q, and ptxas re-derived the value warps' shared-memory base inside their loop (3-4 S2R SR_CgaCtaId
  // a step on sm_90a, none now); long chunks ran 2-4% slower that way (kernel/bench/results/h200/ab.md AI).
  const int q_tok0 = p.qo_indptr[b];
  const int kv_begin = p.kv_indptr[b];
  const int kv_len = request_keys(p, b);
  if (kv_len == 0) {
    // A malformed request (request_keys): no key is read. With one chunk this block writes zeros for its rows
    // (LSE -inf); with several it marks its chunk empty and the combine kernel writes them (no chunk has weight).
    if (p.splits > 1) {
      mark_chunk_empty(p, b, split, row_block * Cfg::kBlockM, Cfg::kBlockM, tid);
    } else if (split == 0) {
      write_empty_rows(p, q_tok0, row_block * Cfg::kBlockM, Cfg::kBlockM, tid, blockDim.x);
    }
    return;
  }
  const int prefix = kv_len - p.q_len;
  const int chunk = chunk_for(p, kv_len);
  const int key_lo = split * chunk;
  if (key_lo >= kv_len) {  // this chunk lies past the request's keys (grid sized for the worst case)
    mark_chunk_empty(p, b, split, row_block * Cfg::kBlockM, Cfg::kBlockM, tid);
    return;
  }
  const int key_hi = min(kv_len, key_lo + chunk);
  const int n_tiles = (key_hi - key_lo + kBlockN - 1) / kBlockN;

  const IdxT* indices = static_cast<const IdxT*>(p.kv_indices) + kv_begin;
  const __nv_bfloat16* kv = static_cast<const __nv_bfloat16*>(p.kv);
  [[maybe_unused]] const unsigned char* kv_raw = static_cast<const unsigned char*>(p.kv);
  [[maybe_unused]] const uint32_t raw_base = smem_addr(smem) + Cfg::kRawOffset;
  const uint32_t smem_base = smem_addr(smem);
  const IdxT* index_ring = reinterpret_cast<const IdxT*>(smem + Cfg::kIndexOffset);
  const uint32_t index_base = smem_base + Cfg::kIndexOffset;
  constexpr int kSlotBytes = kBlockN * 8;
  constexpr int kSlotIdx = kSlotBytes / sizeof(IdxT);
  float* alpha_smem = reinterpret_cast<float*>(smem + Cfg::kAlphaOffset);
  float* inv_sum_smem = reinterpret_cast<float*>(smem + Cfg::kStatsOffset);
  float* pair_sum_smem = reinterpret_cast<float*>(smem + Cfg::kPairSumOffset);

  const int score_warp = score_slot<RG, kSplit>(warp);  // index among the score warps, or -1
  const bool score_role = score_warp >= 0;
  const int value_warp = value_slot<RG, kSplit>(warp);
  if (!score_role && value_warp < 0) return;  // an idle warp of the split layout (block barriers count the rest)
  const int vtid = value_warp * 32 + lane;  // index among the value threads (gathers, pool rows)

  const int rows = p.q_len * p.heads;
  const int block_row0 = row_block * Cfg::kBlockM;
  const int out_row0 = q_tok0 * p.heads;

  // Prologue (value threads): pool rows of the first kIndexSlots tiles, then the gathers of tiles
  // 0 .. kAhead - 1, one cp.async group each. Step j later commits one group: the gather of tile j + kAhead
  // and the pool rows of tile j + kIndexSlots (needed by the gather at step j + kAhead, when that group has
  // landed).
  if (!score_role) {
#pragma unroll
    for (int t = 0; t < Cfg::kIndexSlots; ++t) {
      fetch_tile_rows<IdxT>(index_base + t * kSlotBytes, indices, key_lo + t * kBlockN, key_hi, vtid);
    }
    cp_async_commit();
    cp_async_wait<0>();
  }
  named_barrier(0, Cfg::kThreads);
  if (!score_role) {
#pragma unroll
    for (int t = 0; t < Cfg::kAhead; ++t) {
      if (t < n_tiles) {
        if constexpr (kFp8) {
          gather_raw_tile<IdxT>(raw_base + (t % kRawSlots) * Cfg::kRawBytes, kv_raw, p.kv_row_stride,
                                index_ring + t * kSlotIdx, key_lo + t * kBlockN, key_hi, vtid);
        } else {
          gather_tile<IdxT>(smem_base + t * Cfg::kStageBytes, kv, p.kv_row_stride, index_ring + t * kSlotIdx,
                            key_lo + t * kBlockN, key_hi, vtid);
        }
      }
      cp_async_commit();
    }
    if constexpr (kFp8) {
      // Tile 0 must be in its fp16 stage before the first step's score warps read it.
      cp_async_wait<Cfg::kAhead - 1>();
      named_barrier(kValueBarrier, kValueWarps * 32);
      widen_tile(smem + Cfg::kRawOffset, smem, vtid);
    }
  }

  if (score_role) {
    // ---------------- score warp: rows block_row0 + 16 * pair + {g, g + 8} ----------------
    const int pair = score_warp / kScoreHalves;
    const int half = score_warp % kScoreHalves;
    const int local_row0 = pair * 16;
    float4* exchange =
        reinterpret_cast<float4*>(smem + Cfg::kExchangeOffset) + pair * kScoreHalves * 64;
    const bool warp_live = block_row0 + local_row0 < rows;
    int token[2];
    bool row_live[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int r = block_row0 + local_row0 + g + 8 * i;
      row_live[i] = r < rows;
      token[i] = row_live[i] ? r / p.heads : 0;
    }
    uint32_t qf[kHalfSteps][4];  // Q of this warp's 16 rows and half of the dims, for the whole KV loop
    load_q_fragments<kFp8>(p, qf, reinterpret_cast<unsigned char*>(exchange + half * 64), block_row0 + local_row0,
                           rows, q_tok0, half, lane);
    ScoreState st{{-INFINITY, -INFINITY}, {0.f, 0.f}};
    uint32_t k_lane[2];
    score_k_lanes(half, lane, k_lane);

    for (int it = 0; it <= n_tiles; ++it) {
      named_barrier(0, Cfg::kThreads);  // tile `it` has landed (the value threads waited for it), buffers are free
      if (it < n_tiles && warp_live) {
        score_tile<kFp8>(p, qf, k_lane, half, exchange, 1 + pair, st,
                         smem_base + (it % Cfg::kKStages) * Cfg::kStageBytes,
                   smem + Cfg::kPOffset + (it % 2) * Cfg::kPBufBytes, alpha_smem + (it % 2) * Cfg::kBlockM,
                   local_row0, key_lo + it * kBlockN, key_hi, prefix, q_tok0, token, lane);
      }
    }
    griddep_launch_dependents();  // the combine kernel may start its launch; it waits for this grid's writes
    // Row statistics: the row sums of the pair's two key halves meet in warp `half` 0, which writes 1 / sum for
    // the value warps and the LSE (or this chunk's partial LSE).
    float l[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      l[i] = st.row_sum[i];
      l[i] += __shfl_xor_sync(0xffffffffu, l[i], 1);
      l[i] += __shfl_xor_sync(0xffffffffu, l[i], 2);
      if (c == 0 && half == 1) pair_sum_smem[local_row0 + g + 8 * i] = l[i];
    }
    named_barrier(1 + pair, 32 * kScoreHalves);
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int local = local_row0 + g + 8 * i;
      if (half == 1) continue;
      const float l_row = l[i] + pair_sum_smem[local];
      if (c == 0) inv_sum_smem[local] = l_row > 0.f ? 1.f / l_row : 0.f;
      const float lse2 = l_row > 0.f ? st.row_max[i] + __log2f(l_row) : -INFINITY;
      const int r = block_row0 + local;
      if (!row_live[i] || c != 0) continue;
      if (p.splits == 1) {
        if (p.lse != nullptr) p.lse[out_row0 + r] = lse2 * kLn2;
      } else {
        p.part_lse[(static_cast<int64_t>(b) * p.splits + split) * rows + r] = lse2;
      }
    }
    named_barrier(0, Cfg::kThreads);
    return;
  }

  // ---------------- value warp: output columns col0 .. col0 + 63 of all the block's rows ----------------
  const int col0 = value_warp * kValueCols;
  bool tile_live[RG];
#pragma unroll
  for (int m = 0; m < RG; ++m) tile_live[m] = block_row0 + m * 16 < rows;
  float acc[RG][kValueTiles][4];
#pragma unroll
  for (int m = 0; m < RG; ++m) {
#pragma unroll
    for (int t = 0; t < kValueTiles; ++t) acc[m][t][0] = acc[m][t][1] = acc[m][t][2] = acc[m][t][3] = 0.f;
  }
  // ldmatrix lane addresses: P (A operand, rows x keys) and V (B operand through .trans, keys x columns).
  const uint32_t p_lane = ((lane & 7) + ((lane >> 3) & 1) * 8) * kPRowBytes + (lane >> 4) * 16;
  // V: lanes 0-15 read keys lane % 16 at the pair's first 8 columns, 16-31 the next 8; the value warp's 64
  // columns are one 128-byte line, and pair j's pieces are 2 j and 2 j + 1 of it (swizzled by the key).
  const int v_key = (lane & 7) + ((lane >> 3) & 1) * 8;
  const uint32_t v_lane = v_key * kRowBytes + col0 * 2;
  const uint32_t v_piece = swizzled_piece(lane >> 4, v_key);  // pair j: v_piece ^ (j * 32)

  for (int it = 0; it <= n_tiles; ++it) {
    // Group j holds tile j (j < kAhead: prologue; else committed by step j - kAhead): all but the newest
    // kAhead - 1 done means tile `it` has landed, for this thread; the barrier makes it so for every thread.
    cp_async_wait<Cfg::kPending>();
    named_barrier(0, Cfg::kThreads);
    const int ahead = it + Cfg::kAhead;
    if constexpr (kFp8) {
      // Raw tile it + 1 has landed: widen it into the stage of tile it - 2 (finished by both roles). Then the
      // raw gather of tile it + kAhead, into the slot of tile it (widened in the previous step).
      if (it + 1 < n_tiles) {
        widen_tile(smem + Cfg::kRawOffset + ((it + 1) % kRawSlots) * Cfg::kRawBytes,
                   smem + ((it + 1) % Cfg::kKStages) * Cfg::kStageBytes, vtid);
      }
      if (ahead < n_tiles) {
        gather_raw_tile<IdxT>(raw_base + (ahead % kRawSlots) * Cfg::kRawBytes, kv_raw, p.kv_row_stride,
                              index_ring + (ahead % Cfg::kIndexSlots) * kSlotIdx, key_lo + ahead * kBlockN, key_hi,
                              vtid);
      }
    } else if (ahead < n_tiles) {  // into the stage of tile it - 2, which the value warps finished
      gather_tile<IdxT>(smem_base + (ahead % STAGES) * Cfg::kStageBytes, kv, p.kv_row_stride,
                        index_ring + (ahead % Cfg::kIndexSlots) * kSlotIdx, key_lo + ahead * kBlockN, key_hi, vtid);
    }
    if (it + Cfg::kIndexSlots < n_tiles) {  // the slot of tile it, gathered kAhead steps ago
      fetch_tile_rows<IdxT>(index_base + (it % Cfg::kIndexSlots) * kSlotBytes, indices,
                            key_lo + (it + Cfg::kIndexSlots) * kBlockN, key_hi, vtid);
    }
    cp_async_commit();
    if (it == 0) continue;
    const int t = it - 1;  // the tile the score warps finished in the previous step
    const float* alpha = alpha_smem + (t % 2) * Cfg::kBlockM;
    const uint32_t p_tile = smem_base + Cfg::kPOffset + (t % 2) * Cfg::kPBufBytes + p_lane;
    const uint32_t v_tile = smem_base + (t % Cfg::kKStages) * Cfg::kStageBytes + v_lane;
    // All fragments first (P for each row tile, V for the 8 column tiles), so their shared-memory latency
    // overlaps the rescale below instead of stalling each mma.
    constexpr int kVAhead = 2;  // V fragment pairs in registers at a time (all four would spill at RG = 3)
    uint32_t pa[RG][4];
    uint32_t vb[kVAhead][4];
#pragma unroll
    for (int m = 0; m < RG; ++m) {
      if (tile_live[m]) ldmatrix_x4(p_tile + m * 16 * kPRowBytes, pa[m][0], pa[m][1], pa[m][2], pa[m][3]);
    }
#pragma unroll
    for (int pair = 0; pair < kVAhead; ++pair) {
      ldmatrix_x4_trans(v_tile + (v_piece ^ (pair * 32)), vb[pair][0], vb[pair][1], vb[pair][2], vb[pair][3]);
    }
#pragma unroll
    for (int m = 0; m < RG; ++m) {
      if (!tile_live[m]) continue;
      // Rows g and g + 8 sit side by side (score_tile): one 8-byte load for both.
      const float2 a01 = *reinterpret_cast<const float2*>(alpha + m * 16 + 2 * g);
      const float a0 = a01.x;
      const float a1 = a01.y;
      // Rescale only when a row's maximum moved (rare once the prefix maximum is found).
      if (__any_sync(0xffffffffu, a0 != 1.f || a1 != 1.f)) {
#pragma unroll
        for (int n = 0; n < kValueTiles; ++n) {
          acc[m][n][0] *= a0;
          acc[m][n][1] *= a0;
          acc[m][n][2] *= a1;
          acc[m][n][3] *= a1;
        }
      }
    }
#pragma unroll
    for (int pair = 0; pair < kValueTiles / 2; ++pair) {
      uint32_t(&b)[4] = vb[pair % kVAhead];
#pragma unroll
      for (int m = 0; m < RG; ++m) {
        if (!tile_live[m]) continue;
        mma_16816<kFp8>(acc[m][2 * pair], pa[m], b[0], b[1]);
        mma_16816<kFp8>(acc[m][2 * pair + 1], pa[m], b[2], b[3]);
      }
      if (pair + kVAhead < kValueTiles / 2) {
        ldmatrix_x4_trans(v_tile + (v_piece ^ ((pair + kVAhead) * 32)), b[0], b[1], b[2], b[3]);
      }
    }
  }
  griddep_launch_dependents();
  cp_async_wait<0>();  // leave no copy in flight into shared memory of an exiting block
  named_barrier(0, Cfg::kThreads);  // the score warps' 1 / sum values

  // Epilogue: normalise, then write the output or this chunk's partial through shared memory (the key stages are
  // free now): the fragments' 4-byte words land in a tile of the warp's 64 columns (one 128-byte line a row,
  // pieces swizzled as the key rows are, swizzled_piece, so the 8 rows of a store hit distinct banks), and 8 lanes then store each
  // row's line in 16-byte pieces. Storing the words directly (48 store instructions a warp at 48 rows, each
  // touching 8 rows) took the 48-row block's epilogue ~1.5 us on the H200, ~0.9 us this way (trace_phases.py).
  static_assert(kValueWarps * Cfg::kBlockM * 128 <= Cfg::kKStages * Cfg::kStageBytes, "output tiles in the stages");
  unsigned char* out_tile = smem + value_warp * (Cfg::kBlockM * 128);
#pragma unroll
  for (int m = 0; m < RG; ++m) {
    if (!tile_live[m]) continue;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int local = m * 16 + g + 8 * i;
      const float inv = inv_sum_smem[local] * p.out_scale;
#pragma unroll
      for (int n = 0; n < kValueTiles; ++n) {
        *reinterpret_cast<uint32_t*>(out_tile + local * 128 + swizzled_piece(n, local) + 4 * c) =
            pack_bf16x2(acc[m][n][2 * i] * inv, acc[m][n][2 * i + 1] * inv);
      }
    }
  }
  __syncwarp();
  const int piece = lane % 8;
  __nv_bfloat16* dst_base = p.splits == 1
      ? static_cast<__nv_bfloat16*>(p.out) + static_cast<int64_t>(out_row0) * kValueDim
      : static_cast<__nv_bfloat16*>(p.part_o) + (static_cast<int64_t>(b) * p.splits + split) * rows * kValueDim;
#pragma unroll
  for (int local = lane / 8; local < Cfg::kBlockM; local += 4) {
    const int r = block_row0 + local;
    if (r >= rows) break;
    const uint4 v = *reinterpret_cast<const uint4*>(out_tile + local * 128 + swizzled_piece(piece, local));
    *reinterpret_cast<uint4*>(dst_base + static_cast<int64_t>(r) * kValueDim + col0 + piece * 8) = v;
  }
}

}  // namespace kdtree
