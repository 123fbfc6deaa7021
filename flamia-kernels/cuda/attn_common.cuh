// Pieces shared by the attention kernels: the parameter struct (mirrored by AttnParams in
// src/gpu/attention.rs), the tile table, scale helpers, the FP32-accumulator -> FP8 A-fragment
// conversion and the Hadamard epilogue.
//
// Layouts (T tokens, Tpad = padded tokens, H heads, D = 128):
//   *_tok : E4M3 codes [T, H, D]       (token-major; K-major over the head dim)
//   *_dim : E4M3 codes [H, D, Tpad]    (dim-major; each document starts at a multiple of 64, the
//                                       padding up to the next multiple of 64 holds zero codes)
//   *_exp : i8 exponents [T, H]        (x_hat = decode(code) * 2^exp, one entry per token)
//   o, dq, dk, dv : BF16 [T, H, D];  lse, delta : FP32 [T, Hq] (lse in natural log)
// Accumulator fragment of wgmma m64nN (thread t of the warpgroup, w = t/32, l = t%32, g = l/4,
// q = l%4): d[i] = row 16w + g + 8*((i>>1)&1), column 8*(i>>2) + 2q + (i&1).
#pragma once
#include "common.cuh"
#include "wgmma.cuh"

struct AttnParams {
  const u8* q_tok; const u8* q_dim; const i8* q_exp;
  const u8* k_tok; const u8* k_dim; const i8* k_exp;
  const u8* v_tok; const u8* v_dim; const i8* v_exp;
  const u8* do_tok; const u8* do_dim; const i8* do_exp;
  const int* tiles;      // int4 per 64-token tile: doc start, doc length, padded doc start, tile offset in doc
  u16* o; float* lse; const float* delta;
  u16* dq; u16* dk; u16* dv;
  int T, Tpad, hq, hkv;
  float scale;           // softmax scale
  float scale_log2;      // softmax scale * log2(e)
  int causal;
  int row_ds;            // 1: dS exponents per row of the product (x 32 columns), 0: per 32x32 block
  int hadamard;          // 1: Q and K were rotated; dQ and dK go back through the transform
  // NVFP4 path only: score operands e2m1 * scale as BF16 [T, H, D] with per-token exponents [T, H]
  const u16* q4; const i8* q4_exp;
  const u16* k4; const i8* k4_exp;
};

// NVFP4 = 1: the score product S = Q K^T reads the exact NVFP4 values in BF16 through BF16 wgmma
// (Hopper has no FP4 MMA: FP4 numerics emulated, not FP4 speed); everything else stays E4M3.
#ifndef NVFP4
#define NVFP4 0
#endif
// PROMOTE_DP / PROMOTE_S = 1: dP = dO V^T / the E4M3 score product sum their K = 32 steps in FP32
// (mma_qk_f32sum); 0 (default): one chained FP8 accumulator (mma_qk). Host side:
// FLAMIA_ATTN_PROMOTE (src/gpu/attention.rs). Off by default: 4-8% slower training step, and the
// dQ / dK gap it was meant to close came from BF16 input rounding (docs/kernels.md).
#ifndef PROMOTE_DP
#define PROMOTE_DP 0
#endif
#ifndef PROMOTE_S
#define PROMOTE_S 0
#endif
#define QK_KB (NVFP4 ? 2 * HEAD_DIM : HEAD_DIM)   // bytes per row of a score-operand tile

#define TILE 64

// True when every query of the query tile at q0 (qval valid rows) sees every key of the key
// tile at k0 (kval valid keys): the elementwise loops then run their mask-free copy.
__device__ __forceinline__ bool full_tile(int q0, int qval, int k0, int kval, int causal) {
  return (qval == TILE) & (kval == TILE) & (!causal | (k0 + TILE - 1 <= q0));
}
#define LOG2E 1.4426950408889634f
#define LN2 0.6931471805599453f
#define INV_SQRT_128 0.08838834764831845f
// 1/sqrt(HEAD_DIM): the inverse rotation's normalisation (exact 1/8 at 64).
#define INV_SQRT_HD (HEAD_DIM == 128 ? INV_SQRT_128 : 0.125f)

// 2^n as a float, n clamped to the normal range (exponents this far out only occur for all-zero
// blocks, whose codes are zero).
__device__ __forceinline__ float exp2i(int n) {
  n = max(-126, min(127, n));
  return __int_as_float((n + 127) << 23);
}

__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Smallest e with amax <= 448 * 2^e (exact; the block-scale rule of hopper-kernels.md 2), but
// never below -126: the dS codes are v * 2^-e and their value code * 2^e, and exp2i is exact only
// on [-126, 127] (it clamps). An amax below 448 * 2^-134 used to give e < -126, scaled by the
// clamped 2^126 but reconstructed with 2^-126: such dS values came back doubled. Clamped before
// use, any amax <= 448 * 2^-126 gets e = -126 and its codes stay in range.
__device__ __forceinline__ int e4m3_scale_exp(float amax) {
  // Branch-free (the branchy form cost a BSSY/BSYNC pair and a branch per call in the backward's
  // step): floor(log2 amax) - 8, plus 1 when the mantissa passes 1.75 (fraction bits over
  // 0.75 * 2^23), clamped to -126; zero, subnormal, negative and NaN amax give -126. Equal to the
  // old form on all 2^32 inputs (checked exhaustively on a model of both, session 9).
  // (A positive amax has a clear sign bit; a subnormal or zero one gives e <= -134.)
  const int bits = __float_as_int(amax);
  const int e = (bits >> 23) - 135 + ((bits & 0x7fffff) > 0x600000 ? 1 : 0);
  return amax > 0.f ? max(-126, e) : -126;
}

// e4m3_scale_exp of an amax that is not NaN, in three instructions instead of ~6.5: the bump at a
// mantissa past 1.75 is a carry into the exponent field when 2^21 - 1 is added to the bits (the
// fraction bits over 0.75 * 2^23 are exactly those that carry), and zero, subnormal and negative
// amax (the sum's sign bit set, or wrapped below 2^23) clamp to -126. Equal to e4m3_scale_exp on
// all 2^32 - 2^24 + 2 non-NaN inputs (checked exhaustively, session 37; a NaN may give 120, so
// callers pass maxima that cannot be NaN: fmaxf chains started at +0, or clear a NaN with
// fmaxf(x, 0)). The shift must be the arithmetic one of the signed int (NVCC's: shr.s32), so
// that a sum with its sign bit set (negative amax) lands below -126; (int)(u >> 23) would not.
__device__ __forceinline__ int e4m3_scale_exp_nn(float amax) {
  const u32 u = __float_as_uint(amax) + 0x1fffffu;
  return max(-126, ((int)u >> 23) - 135);
}

// 2^n for n already in [-126, 127] (no clamp: e.g. +-e4m3_scale_exp's results).
__device__ __forceinline__ float exp2i_inrange(int n) { return __int_as_float((n + 127) << 23); }

// Two FP32 values -> two E4M3 codes in the low 16 bits (lo in the low byte), RNE, saturating.
__device__ __forceinline__ u32 cvt_e4m3x2(float lo, float hi) {
  u16 r;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(r) : "f"(hi), "f"(lo));
  return (u32)r;
}

// Four FP32 values -> four E4M3 codes in one register: (lo0, hi0) in the low 16 bits, (lo1, hi1) in
// the high 16 (each pair as cvt_e4m3x2 packs it), without the zero-extension and re-packing that
// two cvt_e4m3x2 and a __byte_perm cost (the two conversions write the halves of one register).
__device__ __forceinline__ u32 cvt_e4m3x4(float lo0, float hi0, float lo1, float hi1) {
  u32 r;
  asm("{\n.reg .b16 l, h;\ncvt.rn.satfinite.e4m3x2.f32 l, %1, %2;\ncvt.rn.satfinite.e4m3x2.f32 h, %3, %4;\n"
      "mov.b32 %0, {l, h};\n}\n"
      : "=r"(r)
      : "f"(hi0), "f"(lo0), "f"(hi1), "f"(lo1));
  return r;
}

// E4M3 code pairs of one K slice of an m64n64 accumulator fragment -> that slice's FP8 A fragment,
// exact layout (wgmma-fp8-notes.md 5, shuffle variant): R0[jj] / R8[jj] = the codes of columns
// 8jj + 2q, +1 of the slice in rows r0 / r0 + 8 (cvt_e4m3x2 of the accumulator pairs).
__device__ __forceinline__ void codes_to_afrag(const u32 (&R0)[4], const u32 (&R8)[4], u32 (&a)[4]) {
  const int q = threadIdx.x & 3;
  u32 WA0 = R0[0] | (R0[2] << 16), WA1 = R0[1] | (R0[3] << 16);
  u32 WB0 = R8[0] | (R8[2] << 16), WB1 = R8[1] | (R8[3] << 16);
  bool odd = q & 1;
  int src1 = 2 * (q & 1) + (q >> 1);
  int src2 = 2 * (q & 1) + 1 - (q >> 1);
  u32 gA1 = __shfl_sync(0xffffffffu, odd ? WA1 : WA0, src1, 4);
  u32 gA2 = __shfl_sync(0xffffffffu, odd ? WA0 : WA1, src2, 4);
  u32 gB1 = __shfl_sync(0xffffffffu, odd ? WB1 : WB0, src1, 4);
  u32 gB2 = __shfl_sync(0xffffffffu, odd ? WB0 : WB1, src2, 4);
  u32 sel_lo = (q < 2) ? 0x5410u : 0x1054u;
  u32 sel_hi = (q < 2) ? 0x7632u : 0x3276u;
  a[0] = __byte_perm(gA1, gA2, sel_lo);
  a[2] = __byte_perm(gA1, gA2, sel_hi);
  a[1] = __byte_perm(gB1, gB2, sel_lo);
  a[3] = __byte_perm(gB1, gB2, sel_hi);
}

// E4M3 code pairs of 32-column K slice kk of an m64n64 accumulator fragment (values already
// scaled): R0[jj] / R8[jj] = columns 8jj + 2q, +1 of the slice in rows r0 / r0 + 8.
__device__ __forceinline__ void slice_codes(const float (&p)[32], int kk, u32 (&R0)[4], u32 (&R8)[4]) {
#pragma unroll
  for (int jj = 0; jj < 4; ++jj) {
    const int i = 16 * kk + 4 * jj;
    R0[jj] = cvt_e4m3x2(p[i + 0], p[i + 1]);
    R8[jj] = cvt_e4m3x2(p[i + 2], p[i + 3]);
  }
}


// The key-permuted packing (BWD_QPERM): lane q's
// code pairs of columns 8jj + 2q, +1 of a 32-column K slice put in place at A index 4q .. 4q+3
// (jj = 0, 1) and 16 + 4q .. +3 (jj = 2, 3): two PRMT per register, no shuffles. The B operand's
// K order must match: position k of each 32-token block holds token
// 16 (k >> 4) + 8 ((k & 3) >> 1) + 2 ((k >> 2) & 3) + (k & 1) (quant.cu dim_token,
// QuantInput::dim_perm). Each k32 step multiplies the same pairs as the exact layout does.
__device__ __forceinline__ void codes_to_afrag_perm(const u32 (&R0)[4], const u32 (&R8)[4], u32 (&a)[4]) {
  a[0] = __byte_perm(R0[0], R0[1], 0x5410);
  a[1] = __byte_perm(R8[0], R8[1], 0x5410);
  a[2] = __byte_perm(R0[2], R0[3], 0x5410);
  a[3] = __byte_perm(R8[2], R8[3], 0x5410);
}

// K slice kk (32 columns) of an accumulator fragment (N floats, values already scaled for E4M3)
// straight into the key-permuted A fragment that codes_to_afrag_perm builds, by cvt_e4m3x4 (each
// register's two code pairs converted into its two halves: two F2FP a register, no PRMT, no
// shuffle): a[0] rows r0, column blocks 0 and 1; a[1] rows r0 + 8, blocks 0, 1; a[2] / a[3] the
// same for blocks 2, 3. The B operand's K order must be BWD_QPERM's (dim_token in quant.cu). Users:
// the v4 backward's dK / dV / dQ operands (BWD_CVT4) and the v4 forward's P (FWD_VPERM).
template <int N>
__device__ __forceinline__ void slice_afrag_cvt4(const float (&v)[N], int kk, u32 (&a)[4]) {
  const int i = 16 * kk;
  a[0] = cvt_e4m3x4(v[i + 0], v[i + 1], v[i + 4], v[i + 5]);
  a[1] = cvt_e4m3x4(v[i + 2], v[i + 3], v[i + 6], v[i + 7]);
  a[2] = cvt_e4m3x4(v[i + 8], v[i + 9], v[i + 12], v[i + 13]);
  a[3] = cvt_e4m3x4(v[i + 10], v[i + 11], v[i + 14], v[i + 15]);
}

// FP32 accumulator of an m64n64 product (32 regs; values already scaled for E4M3) -> the FP8 A
// fragments of its two 32-column K slices: the exact column order, or with PERM the
// key-permuted packing above.
template <bool PERM = false>
__device__ __forceinline__ void acc_to_afrag(const float (&p)[32], u32 (&a)[2][4]) {
#pragma unroll
  for (int kk = 0; kk < 2; ++kk) {
    u32 R0[4], R8[4];
    slice_codes(p, kk, R0, R8);
    if (PERM) {
      codes_to_afrag_perm(R0, R8, a[kk]);
    } else {
      codes_to_afrag(R0, R8, a[kk]);
    }
  }
}

// The issue_* helpers only issue wgmma instructions: the caller brackets them with wg_fence()
// before and wg_commit() / wg_wait<N>() / fence_regs() after, so several products can be in
// flight at once (the mma_* helpers below are the issue-and-wait forms).

// acc[64 x 64] = A[64 x 128] * B[64 x 128]^T, both E4M3 tiles in smem (KB = 128), fresh accumulator.
__device__ __forceinline__ void issue_qk_e4m3(float (&acc)[32], const u8* sA, const u8* sB) {
  const u32 a = smem_u32(sA), b = smem_u32(sB);
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) wgmma_ss_m64n64k32_e4m3(acc, desc_slice<128>(a, kk), desc_slice<128>(b, kk), kk > 0);
}

// S-tile product: acc[64 x 64] = A[64 x 128] * B[64 x 128]^T, both E4M3 tiles in smem (KB = 128),
// fresh accumulator (the FP8 accumulator truncates: never feed an FP32 value back in).
__device__ __forceinline__ void mma_qk(float (&acc)[32], const u8* sA, const u8* sB) {
  wg_fence();
  issue_qk_e4m3(acc, sA, sB);
  wg_commit();
  wg_wait<0>();
  fence_regs(acc);
}

// Same product with every K = 32 step issued into fresh registers (scale-d = 0) and the four steps
// summed in FP32 (FADD): the FP8 accumulator truncates to 13 fraction bits per step, aligned to the
// largest of the step's terms and the running value (wgmma-fp8-notes.md 7), so a chained sum loses
// the low bits of the running value at every step. Used where the error matters: dP = dO V^T, whose
// truncation dS = P (dP - D) amplifies, and the E4M3 score product (forward and both backward
// kernels alike, so the backward recomputes the forward's P). Costs 32 registers and three waits.
// Optional (PROMOTE_DP / PROMOTE_S above).
__device__ __forceinline__ void mma_qk_f32sum(float (&acc)[32], const u8* sA, const u8* sB) {
  u32 a = smem_u32(sA), b = smem_u32(sB);
  float tmp[32];
  wg_fence();
  wgmma_ss_m64n64k32_e4m3(acc, desc_slice<128>(a, 0), desc_slice<128>(b, 0), 0);
  wgmma_ss_m64n64k32_e4m3(tmp, desc_slice<128>(a, 1), desc_slice<128>(b, 1), 0);
  wg_commit();
  wg_wait<0>();
  fence_regs(acc);
  fence_regs(tmp);
#pragma unroll
  for (int i = 0; i < 32; ++i) acc[i] += tmp[i];
#pragma unroll
  for (int kk = 2; kk < 4; ++kk) {
    wg_fence();
    wgmma_ss_m64n64k32_e4m3(tmp, desc_slice<128>(a, kk), desc_slice<128>(b, kk), 0);
    wg_commit();
    wg_wait<0>();
    fence_regs(tmp);
#pragma unroll
    for (int i = 0; i < 32; ++i) acc[i] += tmp[i];
  }
}

// dP = dO V^T (or its transpose) for the backward kernels.
__device__ __forceinline__ void mma_dp(float (&acc)[32], const u8* sA, const u8* sB) {
#if PROMOTE_DP
  mma_qk_f32sum(acc, sA, sB);
#else
  mma_qk(acc, sA, sB);
#endif
}

// Asynchronous copy of the same tile (cp.async, 16 bytes per thread per step; rows at or past
// `valid` are zero-filled). Complete with cp_async_wait, then fence_async_smem + a barrier.
template <int ROWS, int KB>
__device__ __forceinline__ void load_tile_async(u8* s, const u8* g, long long stride, int valid, int tid, int nthreads) {
  constexpr int CH = KB / 16;
  for (int c = tid; c < ROWS * CH; c += nthreads) {
    int r = (c / (8 * CH)) * 8 + (c & 7);
    int k = ((c >> 3) % CH) * 16;
    const bool ok = r < valid;
    const u8* src = ok ? g + r * stride + k : g;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(s + tile_off<KB>(r, k))), "l"(src),
                 "r"(ok ? 16 : 0)
                 : "memory");
  }
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }

// Score tile: acc[64 x 64] = A[64 x 128] * B[64 x 128]^T from the score operands (E4M3, or the
// NVFP4 values in BF16 on the NVFP4 path), fresh accumulator; issue only (no FP32 promotion).
__device__ __forceinline__ void issue_scores(float (&acc)[32], const u8* sA, const u8* sB) {
#if NVFP4
  const u32 a = smem_u32(sA), b = smem_u32(sB);
#pragma unroll
  for (int kk = 0; kk < 8; ++kk) wgmma_ss_m64n64k16_bf16(acc, desc_slice<256>(a, kk), desc_slice<256>(b, kk), kk > 0);
#else
  issue_qk_e4m3(acc, sA, sB);
#endif
}

// Score tile, issued and waited for.
__device__ __forceinline__ void mma_scores(float (&acc)[32], const u8* sA, const u8* sB) {
#if PROMOTE_S && !NVFP4
  mma_qk_f32sum(acc, sA, sB);
#else
  wg_fence();
  issue_scores(acc, sA, sB);
  wg_commit();
  wg_wait<0>();
  fence_regs(acc);
#endif
}

// The two independent products of a backward tile, dP (from dA, dB) and the scores S (from sA,
// sB): issued back to back and waited for once, so the tensor cores run them without a round
// trip in between. Same instructions and results as mma_dp then mma_scores; with FP32 promotion
// (PROMOTE_DP / PROMOTE_S) it is exactly that sequence.
__device__ __forceinline__ void mma_dp_scores(float (&dp)[32], const u8* dA, const u8* dB, float (&sc)[32], const u8* sA,
                                              const u8* sB) {
#if PROMOTE_DP || (PROMOTE_S && !NVFP4)
  mma_dp(dp, dA, dB);
  mma_scores(sc, sA, sB);
#else
  wg_fence();
  issue_qk_e4m3(dp, dA, dB);
  issue_scores(sc, sA, sB);
  wg_commit();
  wg_wait<0>();
  fence_regs(dp);
  fence_regs(sc);
#endif
}

// Score-operand rows: base pointer and row stride in bytes of token `tok`, head `h` of Q (or K).
__device__ __forceinline__ const u8* score_row(const u8* codes, const u16* vals, long long tok, int heads, int h) {
#if NVFP4
  (void)codes;
  return reinterpret_cast<const u8*>(vals + (tok * heads + h) * HEAD_DIM);
#else
  (void)vals;
  return codes + (tok * heads + h) * HEAD_DIM;
#endif
}
__device__ __forceinline__ int score_exp(const i8* e8, const i8* e4, long long idx) {
#if NVFP4
  (void)e8;
  return e4[idx];
#else
  (void)e4;
  return e8[idx];
#endif
}

// acc[64 x 128] = A[64 x 32*NS] (fragments) * B^T, B = [128 rows x 64 bytes] dim-major tile (KB = 64),
// K slices s0 .. s0+NS-1, fresh accumulator.
template <int NS>
__device__ __forceinline__ void mma_pv(float (&acc)[64], const u32 (&a)[2][4], const u8* sB, int s0) {
  const u32 b = smem_u32(sB);
  wg_fence();
#pragma unroll
  for (int kk = 0; kk < NS; ++kk) wgmma_rs_m64n128k32_e4m3(acc, a[s0 + kk], desc_slice<64>(b, s0 + kk), kk > 0);
  wg_commit();
  wg_wait<0>();
  fence_regs(acc);
}

// Max of |v| over each 32x32 block (row_mode == 0) or over each row x 32 columns (row_mode == 1)
// of an m64n64 accumulator, for both K slices s (columns 32s..32s+31): out[s][0] / out[s][1] for
// rows r0 = 16w+g / r0+8. The block case combines warps (0,1) and (2,3) through `red` (8 floats of
// smem) with one barrier; the caller guarantees a barrier before the next write to `red` (every
// loop iteration ends with one).
__device__ __forceinline__ void ds_absmax(const float (&v)[32], int row_mode, float* red, float (&out)[2][2]) {
#pragma unroll
  for (int s = 0; s < 2; ++s) {
    float m0 = 0.f, m1 = 0.f;
#pragma unroll
    for (int j = 4 * s; j < 4 * s + 4; ++j) {
      m0 = fmaxf(m0, fmaxf(fabsf(v[4 * j + 0]), fabsf(v[4 * j + 1])));
      m1 = fmaxf(m1, fmaxf(fabsf(v[4 * j + 2]), fabsf(v[4 * j + 3])));
    }
    m0 = fmaxf(m0, __shfl_xor_sync(0xffffffffu, m0, 1));
    m0 = fmaxf(m0, __shfl_xor_sync(0xffffffffu, m0, 2));
    m1 = fmaxf(m1, __shfl_xor_sync(0xffffffffu, m1, 1));
    m1 = fmaxf(m1, __shfl_xor_sync(0xffffffffu, m1, 2));
    out[s][0] = m0;
    out[s][1] = m1;
  }
  if (row_mode) return;
  const int w = threadIdx.x >> 5;
#pragma unroll
  for (int s = 0; s < 2; ++s) {
    const float m = warp_max(fmaxf(out[s][0], out[s][1]));
    if ((threadIdx.x & 31) == 0) red[w * 2 + s] = m;
  }
  __syncthreads();
#pragma unroll
  for (int s = 0; s < 2; ++s) {
    const float m = fmaxf(red[w * 2 + s], red[(w ^ 1) * 2 + s]);
    out[s][0] = m;
    out[s][1] = m;
  }
}

// dS (values already multiplied by the fold factor) -> per-slice E4M3 A fragments and exponents:
// codes = e4m3(v * 2^-e) with e from ds_absmax. ex[s][r] is the exponent of row r0 / r0+8.
__device__ __forceinline__ void quantise_ds(float (&v)[32], int row_mode, float* red, u32 (&a)[2][4], int (&ex)[2][2]) {
  float mx[2][2];
  ds_absmax(v, row_mode, red, mx);
#pragma unroll
  for (int s = 0; s < 2; ++s) {
    ex[s][0] = e4m3_scale_exp(mx[s][0]);
    ex[s][1] = e4m3_scale_exp(mx[s][1]);
    float f0 = exp2i(-ex[s][0]), f1 = exp2i(-ex[s][1]);
#pragma unroll
    for (int j = 4 * s; j < 4 * s + 4; ++j) {
      v[4 * j + 0] *= f0;
      v[4 * j + 1] *= f0;
      v[4 * j + 2] *= f1;
      v[4 * j + 3] *= f1;
    }
  }
  acc_to_afrag(v, a);
}

// Stores an FP32 accumulator [64 x 128] (64 regs) into smem rows of 128 floats (stride 132 to spread banks).
#define EPI_STRIDE 132
__device__ __forceinline__ void acc_to_smem(const float (&d)[64], float* s, float mul) {
  const int t = threadIdx.x & 127, w = t >> 5, l = t & 31;
  const int r0 = 16 * w + (l >> 2), c0 = 2 * (l & 3);
#pragma unroll
  for (int j = 0; j < 16; ++j) {
    int c = 8 * j + c0;
    s[r0 * EPI_STRIDE + c] = d[4 * j + 0] * mul;
    s[r0 * EPI_STRIDE + c + 1] = d[4 * j + 1] * mul;
    s[(r0 + 8) * EPI_STRIDE + c] = d[4 * j + 2] * mul;
    s[(r0 + 8) * EPI_STRIDE + c + 1] = d[4 * j + 3] * mul;
  }
}

// Normalised Walsh-Hadamard transform of a HEAD_DIM-vector held 4 per lane by HEAD_DIM / 4
// consecutive lanes (element 4 * (lane % (HEAD_DIM / 4)) + j; a warp holds 128 / HEAD_DIM rows):
// stages h = 1, 2 inside the thread, h = 4 .. HEAD_DIM / 2 across lanes, then 1/sqrt(HEAD_DIM).
// All 32 lanes call it.
__device__ __forceinline__ void hadamard_hd(float (&x)[4]) {
  float a0 = x[0] + x[1], a1 = x[0] - x[1], a2 = x[2] + x[3], a3 = x[2] - x[3];
  x[0] = a0 + a2; x[1] = a1 + a3; x[2] = a0 - a2; x[3] = a1 - a3;
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int m = 1; m < HEAD_DIM / 4; m <<= 1) {
    bool upper = lane & m;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      float o = __shfl_xor_sync(0xffffffffu, x[j], m);
      x[j] = upper ? (o - x[j]) : (x[j] + o);
    }
  }
#pragma unroll
  for (int j = 0; j < 4; ++j) x[j] *= INV_SQRT_HD;
}

// Writes rows [0, rows) of a [64 x 128] FP32 smem tile to BF16 global rows (row r at g + r*stride),
// optionally through the Hadamard transform (dQ, dK back to the original basis).
__device__ __forceinline__ void smem_rows_to_bf16(const float* s, u16* g, long long stride, int rows, bool had) {
  const int w = threadIdx.x >> 5, l = threadIdx.x & 31;
  for (int r = w; r < rows; r += 4) {
    float4 v4 = *reinterpret_cast<const float4*>(s + r * EPI_STRIDE + 4 * l);
    float x[4] = {v4.x, v4.y, v4.z, v4.w};
    if (had) hadamard_hd(x);  // the v3.1 kernels: HEAD_DIM 128
    uint2 o = make_uint2(pack_bf16x2(x[0], x[1]), pack_bf16x2(x[2], x[3]));
    *reinterpret_cast<uint2*>(g + r * stride + 4 * l) = o;
  }
}
