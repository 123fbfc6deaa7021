// Transposes of E4M3 code tiles in shared memory by one warp: a token-major tile (row = token,
// HEAD_DIM bytes, the swizzle of that width: tok_off) into the dim-major layout the FP8 wgmma
// takes as a K-major operand over tokens (row = dim, 128 tokens, 128-byte swizzle: sw128_off),
// tokens at or past `nk` written as zeros. User: the v4 backward's dim-major K (BWD_KD_XPOSE; the
// forward's V through it, FWD_VT, measured +16..+74% forward in session 22 and removed). The caller
// fences the async proxy and publishes.
#pragma once
#include "tma.cuh"

__device__ __forceinline__ u32 xpose_key_mask(u32 x, int key, int nk) { return key < nk ? x : 0u; }

// HEAD_DIM == 128: both layouts are 128 x 128 bytes with the same swizzle, so the transpose runs
// in place: 4 x 4-byte block (R, C) (tokens 4R.., dims 4C..; sw128_off(4R + a, 4C)) and block
// (C, R) trade places transposed (the dim-major tile's block (C, R) lies where the token tile's
// block (C, R) does). Pass p < 15 pairs offset k = p + 1: lane l < 32 - k takes (l, l + k), the
// others (l - 32 + k, l); pass 15 offset 16 (lanes < 16) and diagonal blocks 0..15 (the rest),
// pass 16 diagonal blocks 16..31: 528 units, two lanes per bank at worst (a bank model).
__device__ __forceinline__ void xpose_sw128_in_place(u8* t, int nk, int lane) {
#pragma unroll 1
  for (int p = 0; p < 17; ++p) {
    const int k = p + 1;
    int R, C;
    if (p < 15) {
      R = lane < 32 - k ? lane : lane - 32 + k;
      C = lane < 32 - k ? lane + k : lane;
    } else {
      R = p == 15 ? (lane < 16 ? lane : lane - 16) : lane + 16;
      C = p == 15 && lane < 16 ? lane + 16 : R;
    }
    if (p == 16 && lane >= 16) continue;
    u32 a[4], b[4], o[4];
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      a[r] = xpose_key_mask(*reinterpret_cast<const u32*>(t + sw128_off(4 * R + r, 4 * C)), 4 * R + r, nk);
      b[r] = xpose_key_mask(*reinterpret_cast<const u32*>(t + sw128_off(4 * C + r, 4 * R)), 4 * C + r, nk);
    }
    // (a diagonal block: b is a, so both stores below write the same transposed words)
    transpose_bytes_4x4(a, o);
#pragma unroll
    for (int r = 0; r < 4; ++r) *reinterpret_cast<u32*>(t + sw128_off(4 * C + r, 4 * R)) = o[r];
    transpose_bytes_4x4(b, o);
#pragma unroll
    for (int r = 0; r < 4; ++r) *reinterpret_cast<u32*>(t + sw128_off(4 * R + r, 4 * C)) = o[r];
  }
}

// Any HEAD_DIM, from a separate token-major tile `src` (128 tokens) into `dst`: lane l owns dword
// column j = l % (HEAD_DIM / 4) and at its pass i the 4-token group ((32 / NJ) i + l / NJ + l) % 32
// (NJ = HEAD_DIM / 4): 32 distinct banks per access at d = 128, two lanes per bank at 64.
__device__ __forceinline__ void xpose_tok_to_sw128(const u8* src, u8* dst, int nk, int lane) {
  constexpr int NJ = HEAD_DIM / 4;  // dword columns of a token row
  const int j = lane % NJ, l0 = lane / NJ + lane;
#pragma unroll 2
  for (int i = 0; i < NJ; ++i) {
    const int kg = ((32 / NJ) * i + l0) & 31;
    u32 x[4], o[4];
#pragma unroll
    for (int r = 0; r < 4; ++r) x[r] = xpose_key_mask(*reinterpret_cast<const u32*>(src + tok_off(4 * kg + r, 4 * j)), 4 * kg + r, nk);
    transpose_bytes_4x4(x, o);
#pragma unroll
    for (int r = 0; r < 4; ++r) *reinterpret_cast<u32*>(dst + sw128_off(4 * j + r, 4 * kg)) = o[r];
  }
}
