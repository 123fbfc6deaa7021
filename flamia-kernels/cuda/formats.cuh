// The bit-level number-format contract of src/formats.rs and src/hadamard.rs, on the GPU:
// E4M3 encode (PTX cvt.rn.satfinite = formats::e4m3_encode on finite input) and decode, E2M1
// encode, the exponent rules (block_exponent, nvfp4_token_exponent, floor_exponent) computed from
// the bits of amax, and the normalised Hadamard-128 butterfly (stages h = 1, 2, ..., 64 in that
// order, no FMA, then one multiply by RN(1/sqrt(128)) = 0x3DB504F3).
#pragma once
#include "common.cuh"

#define EXP_MIN (-127)
#define EXP_MAX 127

// 2^e for e in [-127, 127] (2^-127 is an f32 subnormal; built exactly).
__device__ __forceinline__ float pow2f(int e) {
  if (e >= -126) return __int_as_float((e + 127) << 23);
  return __int_as_float(0x00400000);  // 2^-127
}

// Smallest e with amax <= (1 + frac/2^23) * 2^lexp * 2^e, clamped; zero / subnormal amax: EXP_MIN.
__device__ __forceinline__ int exponent_above(float amax, int lexp, u32 lfrac) {
  u32 bits = __float_as_uint(amax) & 0x7fffffffu;
  int biased = (int)(bits >> 23);
  if (biased == 0) return EXP_MIN;
  int e = biased - 127 - lexp + ((bits & 0x7fffffu) > lfrac ? 1 : 0);
  return max(EXP_MIN, min(EXP_MAX, e));
}
__device__ __forceinline__ int block_exponent(float amax) { return exponent_above(amax, 8, 0x600000u); }
// block_exponent of an amax that is >= +0 and not NaN (the quantiser's maxima: fmaxf chains
// started at +0), without the branch and the clamps: adding 2^21 - 1 to the bits carries into the
// exponent field exactly when the mantissa passes 1.75, zero and subnormal amax land at -135 or
// -134 (clamped to EXP_MIN) and +inf at 120 (no upper clamp needed). Equal to block_exponent on
// every such input (tests/formats.rs checks this formula on all 2^31 - 2^23 + 1 of them).
__device__ __forceinline__ int block_exponent_nn(float amax) {
  return max(EXP_MIN, (int)((__float_as_uint(amax) + 0x1fffffu) >> 23) - 135);
}
__device__ __forceinline__ int nvfp4_token_exponent(float amax) { return exponent_above(amax, 11, 0x280000u); }
__device__ __forceinline__ int floor_exponent(float amax) {
  u32 bits = __float_as_uint(amax) & 0x7fffffffu;
  int biased = (int)(bits >> 23);
  if (biased == 0) return EXP_MIN;
  return max(EXP_MIN, min(EXP_MAX, biased - 127 - 8));
}

// Four FP32 values -> four E4M3 codes (x0 in the lowest byte), RNE, saturating.
__device__ __forceinline__ u32 e4m3x4(float x0, float x1, float x2, float x3) {
  u16 lo, hi;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(lo) : "f"(x1), "f"(x0));
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(hi) : "f"(x3), "f"(x2));
  return (u32)lo | ((u32)hi << 16);
}
__device__ __forceinline__ u8 e4m3_encode(float x) { return (u8)(e4m3x4(x, 0.f, 0.f, 0.f) & 0xff); }

// Exact E4M3 value of a code (no NaN handling: codes 0x7F/0xFF never come out of a finite encode).
__device__ __forceinline__ float e4m3_decode(u32 c) {
  u32 ex = (c >> 3) & 15u, m = c & 7u;
  float mag = ex == 0 ? (float)m * (1.f / 512.f) : __uint_as_float(((ex - 7u + 127u) << 23) | (m << 20));
  return (c & 0x80u) ? -mag : mag;
}

// E2M1 code (low nibble, bit 3 = sign), RNE to the even code, saturating at 6.
__device__ __forceinline__ u32 e2m1_encode(float x) {
  u32 sign = (__float_as_uint(x) >> 31) << 3;
  float a = fabsf(x);
  u32 m = a <= 0.25f ? 0u : a < 0.75f ? 1u : a <= 1.25f ? 2u : a < 1.75f ? 3u : a <= 2.5f ? 4u : a < 3.5f ? 5u : a <= 5.f ? 6u : 7u;
  return sign | m;
}
__device__ __forceinline__ float e2m1_decode(u32 c) {
  const u32 e = (c >> 1) & 3u, m1 = c & 1u;  // value (2 + m) * 2^(e - 2), subnormal m * 0.5
  float m = e == 0 ? 0.5f * (float)m1 : (float)(2u + m1) * __uint_as_float((e - 2u + 127u) << 23);
  return (c & 8u) ? -m : m;
}

// Normalised Walsh-Hadamard transform of a 128-vector held 4 per lane (element 4*lane + j).
__device__ __forceinline__ void hadamard128_contract(float (&x)[4]) {
  float a0 = __fadd_rn(x[0], x[1]), a1 = __fsub_rn(x[0], x[1]);
  float a2 = __fadd_rn(x[2], x[3]), a3 = __fsub_rn(x[2], x[3]);
  x[0] = __fadd_rn(a0, a2); x[1] = __fadd_rn(a1, a3); x[2] = __fsub_rn(a0, a2); x[3] = __fsub_rn(a1, a3);
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int m = 1; m < 32; m <<= 1) {
    const bool upper = lane & m;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      float o = __shfl_xor_sync(0xffffffffu, x[j], m);
      x[j] = upper ? __fsub_rn(o, x[j]) : __fadd_rn(x[j], o);
    }
  }
  const float c = __uint_as_float(0x3DB504F3u);
#pragma unroll
  for (int j = 0; j < 4; ++j) x[j] = __fmul_rn(x[j], c);
}
