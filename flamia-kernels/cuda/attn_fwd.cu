// FLAMIA attention forward on Hopper FP8 wgmma (NVFP4 path: scores through BF16 wgmma, see
// attn_common.cuh). One CTA = one warpgroup = one 64-query tile of
// one document and one query head; keys in tiles of 64 (causal: up to the tile's last query).
//   S  = Q K^T            SS wgmma m64n64k32 e4m3, fresh accumulator per key tile (with
//                         PROMOTE_S = 1 its four K = 32 steps summed in FP32: mma_qk_f32sum)
//   x  = S * 2^(eQ_i + eK_j) * scale * log2(e)        (row and column factors)
//   P  = exp2(x - m_i)    online softmax in FP32, l_i = sum_j P_ij (unquantised)
//   O += (e4m3(P * 2^(eV_j - Ev + 8)) V) * 2^(Ev - 8)  RS wgmma m64n128k32; Ev = max eV over the keys
//        of the tile that row i sees (per row: a masked key never moves it),
//        so the fold of V's token scales into P is exact and P uses the top of the E4M3 range;
//        fresh accumulator per tile, added to the FP32 O with FFMA.
// Output O = O / l (BF16), lse = (m + log2 l) * ln 2 (FP32, natural log).
#include "attn_common.cuh"
static_assert(HEAD_DIM == 128, "the v3.1 kernels are built for head_dim 128 only");

struct FwdSmem {
  u8 q[TILE * QK_KB];
  u8 k[2][TILE * QK_KB];      // double-buffered: tile j+1 loads (cp.async) while tile j computes
  u8 vt[2][HEAD_DIM * TILE];
  float ek[2][TILE];
  int ev[2][TILE];
};
#ifdef SMEM_FWD_BUDGET
static_assert(sizeof(FwdSmem) + 1024 <= SMEM_FWD_BUDGET, "attn_fwd: dynamic shared memory budget too small");
#endif

extern "C" __global__ void __launch_bounds__(128, 1) attn_fwd(const AttnParams p) {
  extern __shared__ u8 smem_raw[];
  FwdSmem& sm = *reinterpret_cast<FwdSmem*>(smem_aligned_1024(smem_raw));
  const int4 tile = reinterpret_cast<const int4*>(p.tiles)[blockIdx.x];
  const int doc0 = tile.x, L = tile.y, pad0 = tile.z, q0 = tile.w;
  const int h = blockIdx.y, hk = h / (p.hq / p.hkv);
  const int rows = min(TILE, L - q0);
  const int t = threadIdx.x, w = t >> 5, l = t & 31, g = l >> 2, qd = l & 3;
  const int r0 = 16 * w + g;

  load_tile_async<TILE, QK_KB>(sm.q, score_row(p.q_tok, p.q4, doc0 + q0, p.hq, h), (long long)p.hq * QK_KB, rows, t, 128);
  float rowf[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    int row = r0 + 8 * r;
    rowf[r] = row < rows ? exp2i(score_exp(p.q_exp, p.q4_exp, (long long)(doc0 + q0 + row) * p.hq + h)) : 0.f;
  }

  float o[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) o[i] = 0.f;
  float m[2] = {NEG_INF, NEG_INF}, lsum[2] = {0.f, 0.f};
  const int kend = p.causal ? min(L, q0 + TILE) : L;

  auto issue = [&](int k0, int buf) {
    const int kval = min(TILE, L - k0);
    load_tile_async<TILE, QK_KB>(sm.k[buf], score_row(p.k_tok, p.k4, doc0 + k0, p.hkv, hk), (long long)p.hkv * QK_KB, kval, t, 128);
    load_tile_async<HEAD_DIM, TILE>(sm.vt[buf], p.v_dim + (long long)hk * HEAD_DIM * p.Tpad + pad0 + k0, p.Tpad, HEAD_DIM, t, 128);
    cp_async_commit();
    if (t < TILE) {
      bool ok = t < kval;
      long long idx = (long long)(doc0 + k0 + t) * p.hkv + hk;
      sm.ek[buf][t] = ok ? exp2i(score_exp(p.k_exp, p.k4_exp, idx)) : 0.f;
      sm.ev[buf][t] = ok ? (int)p.v_exp[idx] : -1000;
    }
  };
  issue(0, 0);
  for (int k0 = 0, it = 0; k0 < kend; k0 += TILE, ++it) {
    const int kval = min(TILE, L - k0), buf = it & 1;
    if (k0 + TILE < kend) {
      issue(k0 + TILE, buf ^ 1);  // buffer buf^1 was released by the barrier that ended the last iteration
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    fence_async_smem();
    __syncthreads();
    const float* ek = sm.ek[buf];
    const int* ev = sm.ev[buf];

    float s[32];
    mma_scores(s, sm.q, sm.k[buf]);

    float tmax[2] = {NEG_INF, NEG_INF};
    int evr[2] = {-1000, -1000};  // max eV over the keys each row sees (never a masked key: causal safety)
    auto scores = [&](const bool masked) {  // inlined twice: the flag is a constant in each copy
#pragma unroll
      for (int i = 0; i < 32; ++i) {
        const int r = (i >> 1) & 1, row = r0 + 8 * r, col = 8 * (i >> 2) + 2 * qd + (i & 1);
        const bool ok = !masked || ((col < kval) & (row < rows) & (!p.causal | (k0 + col <= q0 + row)));
        float x = s[i] * (rowf[r] * ek[col]) * p.scale_log2;
        s[i] = ok ? x : NEG_INF;
        tmax[r] = fmaxf(tmax[r], s[i]);
        evr[r] = max(evr[r], ok ? ev[col] : -1000);
      }
    };
    // Interior tile (every query sees every key): no mask. Uniform over the CTA.
    if (full_tile(q0, rows, k0, kval, p.causal))
      scores(false);
    else
      scores(true);
    float alpha[2], mref[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      tmax[r] = fmaxf(tmax[r], __shfl_xor_sync(0xffffffffu, tmax[r], 1));
      tmax[r] = fmaxf(tmax[r], __shfl_xor_sync(0xffffffffu, tmax[r], 2));
      evr[r] = max(evr[r], __shfl_xor_sync(0xffffffffu, evr[r], 1));
      evr[r] = max(evr[r], __shfl_xor_sync(0xffffffffu, evr[r], 2));
      float mn = fmaxf(m[r], tmax[r]);
      mref[r] = mn == NEG_INF ? 0.f : mn;
      alpha[r] = fast_exp2(m[r] - mref[r]);
      m[r] = mn;
    }
    float ps[2] = {0.f, 0.f};
#pragma unroll
    for (int i = 0; i < 32; ++i) {
      const int r = (i >> 1) & 1, col = 8 * (i >> 2) + 2 * qd + (i & 1);
      float pr = fast_exp2(s[i] - mref[r]);
      ps[r] += pr;
      s[i] = pr * exp2i(ev[col] - evr[r] + 8);  // fold V's token scale (exact power of two)
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      ps[r] += __shfl_xor_sync(0xffffffffu, ps[r], 1);
      ps[r] += __shfl_xor_sync(0xffffffffu, ps[r], 2);
      lsum[r] = lsum[r] * alpha[r] + ps[r];
    }
    u32 a[2][4];
    acc_to_afrag(s, a);
    float pv[64];
    mma_pv<2>(pv, a, sm.vt[buf], 0);
    const float f0 = exp2i(evr[0] - 8), f1 = exp2i(evr[1] - 8);
#pragma unroll
    for (int i = 0; i < 64; ++i) o[i] = o[i] * alpha[(i >> 1) & 1] + pv[i] * (((i >> 1) & 1) ? f1 : f0);
    __syncthreads();  // every thread is past this tile's smem reads before it is refilled
  }

  // epilogue: O / l in BF16 straight from the fragment, LSE per row
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = r0 + 8 * r;
    if (row >= rows) continue;
    const float inv = lsum[r] > 0.f ? 1.f / lsum[r] : 0.f;
    u16* orow = p.o + ((long long)(doc0 + q0 + row) * p.hq + h) * HEAD_DIM;
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      const int c = 8 * j + 2 * qd;
      *reinterpret_cast<u32*>(orow + c) = pack_bf16x2(o[4 * j + 2 * r] * inv, o[4 * j + 2 * r + 1] * inv);
    }
    if (qd == 0) p.lse[(long long)(doc0 + q0 + row) * p.hq + h] = (m[r] + __log2f(lsum[r])) * LN2;
  }
}
