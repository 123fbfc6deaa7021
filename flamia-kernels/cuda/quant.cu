// Fused quantisers: one launch per input tensor. Each CTA (4 warps) takes one 32-token block of
// one document and one head (warp w: tokens 8w .. 8w+7; lane l: dims 4l .. 4l+3) and does the
// optional Hadamard rotation, the amax, the exponent, the E4M3 codes in both layouts the attention
// kernels read (token-major and dim-major, see attn_common.cuh) and the per-token exponent table;
// for dO also D_i = dO_hat_i . O_i (FP32, [T, H]) from the quantised dO.
// Defines: HADAMARD (0/1), MODE (0 = 32-token blocks, 1 = per token, 2 = tensor-wide floor, the
// leaky control; its amax comes from quant_amax), DELTA (0/1).
// quant_nvfp4: NVFP4 (E2M1 codes, E4M3 group scales per 16 dims, per-token exponent) plus the exact
// value e2m1 * scale in BF16 for the emulated NVFP4 score product.
// The bit-level contract is src/quant.rs; GPU tests compare every byte.
#include "formats.cuh"

#ifndef HADAMARD
#define HADAMARD 0
#endif
#ifndef MODE
#define MODE 0
#endif
#ifndef DELTA
#define DELTA 0
#endif

struct QuantParams {
  const u16* x;          // BF16 [T, H, D]
  const int* blocks;     // int4 per 32-token block: doc start, doc length, padded doc start, block offset in doc
  u8* tok;               // [T, H, D]
  u8* dim;               // [H, D, Tpad]
  i8* exps;              // [T, H]
  const u16* o;          // DELTA: forward output O, BF16 [T, H, D]
  float* delta;          // DELTA: [T, H]
  const u32* amax_in;    // MODE 2: tensor-wide amax (bits of a non-negative float)
  u32* amax_out;         // quant_amax: atomically maxed (zero it first)
  u8* fp4_codes;         // [T, H, D] (low nibble)
  u8* fp4_scales;        // [T, H, D / 16]
  u16* fp4_vals;         // [T, H, D] BF16 e2m1 * scale
  int T, Tpad, H;
};

__device__ __forceinline__ void load_row(const QuantParams& p, long long tok, int h, float (&v)[4]) {
  uint2 raw = *reinterpret_cast<const uint2*>(p.x + (tok * p.H + h) * HEAD_DIM + 4 * (threadIdx.x & 31));
  v[0] = bf16_to_f32(raw.x & 0xffff);
  v[1] = bf16_to_f32(raw.x >> 16);
  v[2] = bf16_to_f32(raw.y & 0xffff);
  v[3] = bf16_to_f32(raw.y >> 16);
#if HADAMARD
  hadamard128_contract(v);
#endif
}

__device__ __forceinline__ float absmax4(const float (&v)[4]) {
  return fmaxf(fmaxf(fabsf(v[0]), fabsf(v[1])), fmaxf(fabsf(v[2]), fabsf(v[3])));
}

extern "C" __global__ void __launch_bounds__(128) quant_e4m3(const QuantParams p) {
  __shared__ __align__(16) u8 codes[32][HEAD_DIM + 16];
  __shared__ float wmax[4];
  const int4 blk = reinterpret_cast<const int4*>(p.blocks)[blockIdx.x];
  const int doc0 = blk.x, L = blk.y, pad0 = blk.z, b0 = blk.w;
  const int h = blockIdx.y, w = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int n = min(32, L - b0);

  float v[8][4], tmax[8];
  float m = 0.f;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int tt = 8 * w + i;
    if (tt < n) {
      load_row(p, doc0 + b0 + tt, h, v[i]);
    } else {
      v[i][0] = v[i][1] = v[i][2] = v[i][3] = 0.f;
    }
    tmax[i] = warp_max(absmax4(v[i]));
    m = fmaxf(m, tmax[i]);
  }
#if MODE == 0
  if (lane == 0) wmax[w] = m;
  __syncthreads();
  const int eb = block_exponent(fmaxf(fmaxf(wmax[0], wmax[1]), fmaxf(wmax[2], wmax[3])));
#elif MODE == 2
  const int eb = floor_exponent(__uint_as_float(*p.amax_in));
#endif
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int tt = 8 * w + i;
#if MODE == 1
    const int e = block_exponent(tmax[i]);
#else
    const int e = eb;
#endif
    const float f = pow2f(-e);
    u32 c = e4m3x4(v[i][0] * f, v[i][1] * f, v[i][2] * f, v[i][3] * f);
    if (tt >= n) c = 0;
    *reinterpret_cast<u32*>(&codes[tt][4 * lane]) = c;
    if (tt < n) {
      const long long tok = doc0 + b0 + tt;
      *reinterpret_cast<u32*>(p.tok + (tok * p.H + h) * HEAD_DIM + 4 * lane) = c;
      if (lane == 0) p.exps[tok * p.H + h] = (i8)e;
#if DELTA
      uint2 raw = *reinterpret_cast<const uint2*>(p.o + (tok * p.H + h) * HEAD_DIM + 4 * lane);
      const float o4[4] = {bf16_to_f32(raw.x & 0xffff), bf16_to_f32(raw.x >> 16), bf16_to_f32(raw.y & 0xffff),
                           bf16_to_f32(raw.y >> 16)};
      float s = 0.f;
#pragma unroll
      for (int j = 0; j < 4; ++j) s += e4m3_decode((c >> (8 * j)) & 0xffu) * o4[j];
#pragma unroll
      for (int o_ = 16; o_; o_ >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o_);
      // value = decode * 2^e: apply the exponent once to the sum (exact power of two)
      if (lane == 0) p.delta[tok * p.H + h] = e >= -126 ? s * pow2f(e) : (s * 0.5f) * pow2f(e + 1);
#endif
    }
  }
  __syncthreads();
  // dim-major copy: thread d writes the 32 codes of dim d (and the zero padding after the last block)
  const int d = threadIdx.x;
  u32 wv[8];
#pragma unroll
  for (int k = 0; k < 8; ++k)
    wv[k] = (u32)codes[4 * k][d] | ((u32)codes[4 * k + 1][d] << 8) | ((u32)codes[4 * k + 2][d] << 16) |
            ((u32)codes[4 * k + 3][d] << 24);
  uint4* dst = reinterpret_cast<uint4*>(p.dim + ((long long)h * HEAD_DIM + d) * p.Tpad + pad0 + b0);
  dst[0] = make_uint4(wv[0], wv[1], wv[2], wv[3]);
  dst[1] = make_uint4(wv[4], wv[5], wv[6], wv[7]);
  const int padded = (L + 63) & ~63;
  if (b0 + 32 >= L && b0 + 32 < padded) {
    dst[2] = make_uint4(0, 0, 0, 0);
    dst[3] = make_uint4(0, 0, 0, 0);
  }
}

// Tensor-wide amax (after the rotation) for MODE 2: one warp per (token, head).
extern "C" __global__ void __launch_bounds__(128) quant_amax(const QuantParams p) {
  const long long row = (long long)blockIdx.x * 4 + (threadIdx.x >> 5);
  if (row >= (long long)p.T * p.H) return;
  float v[4];
  load_row(p, row / p.H, (int)(row % p.H), v);
  float m = warp_max(absmax4(v));
  if ((threadIdx.x & 31) == 0) atomicMax(p.amax_out, __float_as_uint(m));
}

// NVFP4: one warp per (token, head) row; lanes 4g .. 4g+3 hold group g (16 dims).
extern "C" __global__ void __launch_bounds__(128) quant_nvfp4(const QuantParams p) {
  const long long row = (long long)blockIdx.x * 4 + (threadIdx.x >> 5);
  if (row >= (long long)p.T * p.H) return;
  const int lane = threadIdx.x & 31;
  float v[4];
  load_row(p, row / p.H, (int)(row % p.H), v);
  const int et = nvfp4_token_exponent(warp_max(absmax4(v)));
  const float inv = pow2f(-et);
  float gm = absmax4(v);
  gm = fmaxf(gm, __shfl_xor_sync(0xffffffffu, gm, 1));
  gm = fmaxf(gm, __shfl_xor_sync(0xffffffffu, gm, 2));
  const u32 sc = e4m3_encode(__fdiv_rn(__fmul_rn(gm, inv), 6.f));
  const float scale = e4m3_decode(sc);
  u32 c4 = 0;
  float val[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    u32 c = scale == 0.f ? ((__float_as_uint(v[j]) >> 31) << 3) : e2m1_encode(__fdiv_rn(__fmul_rn(v[j], inv), scale));
    c4 |= c << (8 * j);
    val[j] = e2m1_decode(c) * scale;  // exact in BF16 (at most 6 significant bits)
  }
  *reinterpret_cast<u32*>(p.fp4_codes + row * HEAD_DIM + 4 * lane) = c4;
  *reinterpret_cast<uint2*>(p.fp4_vals + row * HEAD_DIM + 4 * lane) =
      make_uint2(pack_bf16x2(val[0], val[1]), pack_bf16x2(val[2], val[3]));
  if ((lane & 3) == 0) p.fp4_scales[row * (HEAD_DIM / 16) + lane / 4] = (u8)sc;
  if (lane == 0) p.exps[row] = (i8)et;
}
