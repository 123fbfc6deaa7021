// FLAMIA attention backward on Hopper FP8 wgmma, as two deterministic kernels (no atomics, so
// repeated runs and the causal-leakage checks are bitwise reproducible):
//   attn_bwd_dkdv: one CTA per (64-key tile, KV head); loops over the query heads of its group and
//                  the query tiles that see the keys. dV = P^T dO, dK = scale * dS^T Q (rotated basis,
//                  turned back with the Hadamard transform in the epilogue).
//   attn_bwd_dq:   one CTA per (64-query tile, query head); loops over key tiles. dQ = scale * dS K.
// NVFP4 = 1: S from the NVFP4 values (BF16 wgmma, attn_common.cuh), dQ / dK from the E4M3 codes.
// Both recompute S from the same codes and exponents as the forward, x with the same expression,
// P = exp2(x - lse * log2 e) (forward/backward consistency, hopper-kernels.md 4), and
// D_i = dO_i . O_i comes from the dO quantiser (the same quantised dO that feeds dP).
// With PROMOTE_DP / PROMOTE_S = 1 (off by default), dP = dO V^T and S sum their four K = 32 wgmma
// steps in FP32 (mma_qk_f32sum: the chained FP8 accumulator truncates, and dS = P (dP - D) cancels).
// Scales: dP = (dO V^T) * 2^(edO + eV); dV: P^T * 2^(edO_q - Ed + 8) in E4M3 (Ed = max edO over
// the queries the key row sees);
// dK / dQ: dS * 2^(eQ_q) (resp. 2^(eK_k)) quantised to E4M3 with one power-of-two exponent per
// 32x32 block or, with row_ds, per row of the product x 32 columns; one fresh wgmma per 32-wide
// K slice so each slice's exponent is applied in FP32 (FFMA into the FP32 accumulator).
#include "attn_common.cuh"
static_assert(HEAD_DIM == 128, "the v3.1 kernels are built for head_dim 128 only");

struct DkdvSmem {
  u8 k[TILE * QK_KB];         // A of S^T = K Q^T
  u8 v[TILE * HEAD_DIM];      // A of dP^T = V dO^T
  u8 q[2][TILE * QK_KB];      // B of S^T          (two buffers: item i+1 never waits for item i's readers)
  u8 dO[2][TILE * HEAD_DIM];  // B of dP^T
  u8 qt[2][HEAD_DIM * TILE];  // B of dK = dS^T Q   (dim-major)
  u8 dot[2][HEAD_DIM * TILE]; // B of dV = P^T dO   (dim-major)
  float eq[2][TILE], eqf[2][TILE], edo[2][TILE], lse2[2][TILE], delta[2][TILE];  // eq: score exponent, eqf: fold into dS
  int edo_i[2][TILE];
  float red[8];
};
#ifdef SMEM_DKDV_BUDGET
static_assert(sizeof(DkdvSmem) + 1024 <= SMEM_DKDV_BUDGET, "attn_bwd_dkdv: dynamic shared memory budget too small");
#endif

extern "C" __global__ void __launch_bounds__(128, 1) attn_bwd_dkdv(const AttnParams p) {
  extern __shared__ u8 smem_raw[];
  DkdvSmem& sm = *reinterpret_cast<DkdvSmem*>(smem_aligned_1024(smem_raw));
  const int4 tile = reinterpret_cast<const int4*>(p.tiles)[blockIdx.x];
  const int doc0 = tile.x, L = tile.y, pad0 = tile.z, k0 = tile.w;
  const int hk = blockIdx.y, group = p.hq / p.hkv;
  const int kval = min(TILE, L - k0);
  const int t = threadIdx.x, w = t >> 5, l = t & 31, g = l >> 2, qd = l & 3;
  const int r0 = 16 * w + g;

  load_tile_async<TILE, QK_KB>(sm.k, score_row(p.k_tok, p.k4, doc0 + k0, p.hkv, hk), (long long)p.hkv * QK_KB, kval, t, 128);
  load_tile_async<TILE, HEAD_DIM>(sm.v, p.v_tok + ((long long)(doc0 + k0) * p.hkv + hk) * HEAD_DIM,
                            (long long)p.hkv * HEAD_DIM, kval, t, 128);
  float fk[2], fv[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = r0 + 8 * r;
    const long long idx = (long long)(doc0 + k0 + row) * p.hkv + hk;
    fk[r] = row < kval ? exp2i(score_exp(p.k_exp, p.k4_exp, idx)) : 0.f;
    fv[r] = row < kval ? exp2i(p.v_exp[idx]) : 0.f;
  }
  float dk[64], dv[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) dk[i] = dv[i] = 0.f;

  // work items: (query head of the group, query tile), flattened
  const int qstart = p.causal ? k0 : 0;
  const int nq = (L - qstart + TILE - 1) / TILE;
  const int items = group * nq;
  auto issue = [&](int item, int buf) {
    const int h = hk * group + item / nq, q0 = qstart + (item % nq) * TILE;
    const int qval = min(TILE, L - q0);
    const long long tok = (long long)(doc0 + q0) * p.hq + h;
    load_tile_async<TILE, QK_KB>(sm.q[buf], score_row(p.q_tok, p.q4, doc0 + q0, p.hq, h), (long long)p.hq * QK_KB, qval, t, 128);
    load_tile_async<TILE, HEAD_DIM>(sm.dO[buf], p.do_tok + tok * HEAD_DIM, (long long)p.hq * HEAD_DIM, qval, t, 128);
    const long long dbase = (long long)h * HEAD_DIM * p.Tpad + pad0 + q0;
    load_tile_async<HEAD_DIM, TILE>(sm.qt[buf], p.q_dim + dbase, p.Tpad, HEAD_DIM, t, 128);
    load_tile_async<HEAD_DIM, TILE>(sm.dot[buf], p.do_dim + dbase, p.Tpad, HEAD_DIM, t, 128);
    cp_async_commit();
    if (t < TILE) {
      const bool ok = t < qval;
      const long long idx = (long long)(doc0 + q0 + t) * p.hq + h;
      sm.eq[buf][t] = ok ? exp2i(score_exp(p.q_exp, p.q4_exp, idx)) : 0.f;
      sm.eqf[buf][t] = ok ? exp2i(p.q_exp[idx]) : 0.f;
      sm.edo[buf][t] = ok ? exp2i(p.do_exp[idx]) : 0.f;
      sm.edo_i[buf][t] = ok ? (int)p.do_exp[idx] : -1000;
      sm.lse2[buf][t] = ok ? p.lse[idx] * LOG2E : 0.f;
      sm.delta[buf][t] = ok ? p.delta[idx] : 0.f;
    }
  };
  issue(0, 0);
  for (int item = 0; item < items; ++item) {
    const int buf = item & 1;
    const int q0 = qstart + (item % nq) * TILE;
    const int qval = min(TILE, L - q0);
    // The next item loads into the other buffers while this one computes (they were last read
    // by the previous item, before the barrier that ended it).
    if (item + 1 < items) {
      issue(item + 1, buf ^ 1);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    fence_async_smem();
    __syncthreads();
    {
      float pt[32], ds[32];
      mma_dp_scores(ds, sm.v, sm.dO[buf], pt, sm.k, sm.q[buf]);  // dP^T and S^T (rows = keys, columns = queries)
      int edr[2] = {-1000, -1000};  // max edO over the queries each key row sees
      auto make_p_ds = [&](const bool masked) {  // inlined twice: the flag is a constant in each copy
#pragma unroll
        for (int i = 0; i < 32; ++i) {
          const int r = (i >> 1) & 1, row = r0 + 8 * r, col = 8 * (i >> 2) + 2 * qd + (i & 1);
          const bool ok = !masked || ((row < kval) & (col < qval) & (!p.causal | (q0 + col >= k0 + row)));
          const float x = pt[i] * (sm.eq[buf][col] * fk[r]) * p.scale_log2;
          const float pr = fast_exp2(ok ? x - sm.lse2[buf][col] : NEG_INF);  // ex2(-inf) = +0: no branch
          const float dp = ds[i] * (fv[r] * sm.edo[buf][col]);
          ds[i] = pr * (dp - sm.delta[buf][col]) * sm.eqf[buf][col];  // dS^T with Q's token scale folded
          pt[i] = pr;
          if (ok) edr[r] = max(edr[r], sm.edo_i[buf][col]);
        }
      };
      // Interior item (every query of the tile sees every key): no mask. Uniform over the CTA.
      if (full_tile(q0, qval, k0, kval, p.causal))
        make_p_ds(false);
      else
        make_p_ds(true);
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        edr[r] = max(edr[r], __shfl_xor_sync(0xffffffffu, edr[r], 1));
        edr[r] = max(edr[r], __shfl_xor_sync(0xffffffffu, edr[r], 2));
      }
#pragma unroll
      for (int i = 0; i < 32; ++i) {
        const int r = (i >> 1) & 1, col = 8 * (i >> 2) + 2 * qd + (i & 1);
        pt[i] *= exp2i(sm.edo_i[buf][col] - edr[r] + 8);  // P^T with dO's token scale folded
      }
      // Both A operands are converted to E4M3 fragments before any product is issued (dS^T first:
      // its block maxima need a barrier), so pt and ds are dead while the 64-register product
      // accumulators live: no spills at 255 registers.
      u32 ads[2][4], ap[2][4];
      int ex[2][2];
      quantise_ds(ds, p.row_ds, sm.red, ads, ex);
      acc_to_afrag(pt, ap);
      float acc[64];
      {  // dV += (P^T dO) * 2^(ed_row - 8)
        mma_pv<2>(acc, ap, sm.dot[buf], 0);
        const float f0 = exp2i(edr[0] - 8), f1 = exp2i(edr[1] - 8);
#pragma unroll
        for (int i = 0; i < 64; ++i) dv[i] += acc[i] * (((i >> 1) & 1) ? f1 : f0);
      }
#pragma unroll
      for (int s = 0; s < 2; ++s) {  // dK += sum over 32-query slices of (codes(dS^T) Q) * 2^e(row, slice)
        mma_pv<1>(acc, ads, sm.qt[buf], s);
        const float f0 = exp2i(ex[s][0]), f1 = exp2i(ex[s][1]);
#pragma unroll
        for (int i = 0; i < 64; ++i) dk[i] += acc[i] * (((i >> 1) & 1) ? f1 : f0);
      }
    }
    __syncthreads();  // this item's buffers are free for the prefetch after next
  }

  // epilogue: dV straight from the fragment; dK * scale through smem and the Hadamard transform
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = r0 + 8 * r;
    if (row >= kval) continue;
    u16* vrow = p.dv + ((long long)(doc0 + k0 + row) * p.hkv + hk) * HEAD_DIM;
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      const int c = 8 * j + 2 * qd;
      *reinterpret_cast<u32*>(vrow + c) = pack_bf16x2(dv[4 * j + 2 * r], dv[4 * j + 2 * r + 1]);
    }
  }
  __syncthreads();
  float* ep = reinterpret_cast<float*>(&sm);
  acc_to_smem(dk, ep, p.scale);
  __syncthreads();
  smem_rows_to_bf16(ep, p.dk + ((long long)(doc0 + k0) * p.hkv + hk) * HEAD_DIM, (long long)p.hkv * HEAD_DIM, kval, p.hadamard != 0);
}

struct DqSmem {
  u8 q[TILE * QK_KB];         // A of S = Q K^T
  u8 dO[TILE * HEAD_DIM];     // A of dP = dO V^T
  u8 k[2][TILE * QK_KB];      // B of S            (double-buffered, cp.async)
  u8 v[2][TILE * HEAD_DIM];   // B of dP
  u8 kt[2][HEAD_DIM * TILE];  // B of dQ = dS K (dim-major)
  float ek[2][TILE], ekf[2][TILE], ev[2][TILE];  // ek: score exponent, ekf: fold into dS
  float red[8];
};
#ifdef SMEM_DQ_BUDGET
static_assert(sizeof(DqSmem) + 1024 <= SMEM_DQ_BUDGET, "attn_bwd_dq: dynamic shared memory budget too small");
#endif

extern "C" __global__ void __launch_bounds__(128, 1) attn_bwd_dq(const AttnParams p) {
  extern __shared__ u8 smem_raw[];
  DqSmem& sm = *reinterpret_cast<DqSmem*>(smem_aligned_1024(smem_raw));
  const int4 tile = reinterpret_cast<const int4*>(p.tiles)[blockIdx.x];
  const int doc0 = tile.x, L = tile.y, pad0 = tile.z, q0 = tile.w;
  const int h = blockIdx.y, hk = h / (p.hq / p.hkv);
  const int rows = min(TILE, L - q0);
  const int t = threadIdx.x, w = t >> 5, l = t & 31, g = l >> 2, qd = l & 3;
  const int r0 = 16 * w + g;

  const long long tok = (long long)(doc0 + q0) * p.hq + h;
  load_tile_async<TILE, QK_KB>(sm.q, score_row(p.q_tok, p.q4, doc0 + q0, p.hq, h), (long long)p.hq * QK_KB, rows, t, 128);
  load_tile_async<TILE, HEAD_DIM>(sm.dO, p.do_tok + tok * HEAD_DIM, (long long)p.hq * HEAD_DIM, rows, t, 128);
  float fq[2], fdo[2], lse2[2], dlt[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = r0 + 8 * r;
    const bool ok = row < rows;
    const long long idx = (long long)(doc0 + q0 + row) * p.hq + h;
    const long long sidx = idx;
    fq[r] = ok ? exp2i(score_exp(p.q_exp, p.q4_exp, idx)) : 0.f;
    fdo[r] = ok ? exp2i(p.do_exp[idx]) : 0.f;
    lse2[r] = ok ? p.lse[sidx] * LOG2E : 0.f;
    dlt[r] = ok ? p.delta[sidx] : 0.f;
  }
  float dq[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) dq[i] = 0.f;
  const int kend = p.causal ? min(L, q0 + TILE) : L;

  auto issue = [&](int k0, int buf) {
    const int kval = min(TILE, L - k0);
    const long long ktok = (long long)(doc0 + k0) * p.hkv + hk;
    load_tile_async<TILE, QK_KB>(sm.k[buf], score_row(p.k_tok, p.k4, doc0 + k0, p.hkv, hk), (long long)p.hkv * QK_KB, kval, t, 128);
    load_tile_async<TILE, HEAD_DIM>(sm.v[buf], p.v_tok + ktok * HEAD_DIM, (long long)p.hkv * HEAD_DIM, kval, t, 128);
    load_tile_async<HEAD_DIM, TILE>(sm.kt[buf], p.k_dim + (long long)hk * HEAD_DIM * p.Tpad + pad0 + k0, p.Tpad, HEAD_DIM, t, 128);
    cp_async_commit();
    if (t < TILE) {
      const bool ok = t < kval;
      const long long idx = (long long)(doc0 + k0 + t) * p.hkv + hk;
      sm.ek[buf][t] = ok ? exp2i(score_exp(p.k_exp, p.k4_exp, idx)) : 0.f;
      sm.ekf[buf][t] = ok ? exp2i(p.k_exp[idx]) : 0.f;
      sm.ev[buf][t] = ok ? exp2i(p.v_exp[idx]) : 0.f;
    }
  };
  issue(0, 0);
  for (int k0 = 0, it = 0; k0 < kend; k0 += TILE, ++it) {
    const int kval = min(TILE, L - k0), buf = it & 1;
    if (k0 + TILE < kend) {
      issue(k0 + TILE, buf ^ 1);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    fence_async_smem();
    __syncthreads();
    const float* ek = sm.ek[buf];
    const float* ekf = sm.ekf[buf];
    const float* ev = sm.ev[buf];

    float s[32], ds[32];
    mma_dp_scores(ds, sm.dO, sm.v[buf], s, sm.q, sm.k[buf]);  // dP and S
    auto make_ds = [&](const bool masked) {  // inlined twice: the flag is a constant in each copy
#pragma unroll
      for (int i = 0; i < 32; ++i) {
        const int r = (i >> 1) & 1, row = r0 + 8 * r, col = 8 * (i >> 2) + 2 * qd + (i & 1);
        const bool ok = !masked || ((col < kval) & (row < rows) & (!p.causal | (k0 + col <= q0 + row)));
        const float x = s[i] * (fq[r] * ek[col]) * p.scale_log2;
        const float pr = fast_exp2(ok ? x - lse2[r] : NEG_INF);  // ex2(-inf) = +0: no branch
        const float dp = ds[i] * (fdo[r] * ev[col]);
        ds[i] = pr * (dp - dlt[r]) * ekf[col];  // dS with K's token scale folded
      }
    };
    // Interior tile (every query sees every key): no mask. Uniform over the CTA.
    if (full_tile(q0, rows, k0, kval, p.causal))
      make_ds(false);
    else
      make_ds(true);
    u32 a[2][4];
    int ex[2][2];
    quantise_ds(ds, p.row_ds, sm.red, a, ex);
#pragma unroll
    for (int s2 = 0; s2 < 2; ++s2) {
      float acc[64];
      mma_pv<1>(acc, a, sm.kt[buf], s2);
      const float f0 = exp2i(ex[s2][0]), f1 = exp2i(ex[s2][1]);
#pragma unroll
      for (int i = 0; i < 64; ++i) dq[i] += acc[i] * (((i >> 1) & 1) ? f1 : f0);
    }
    __syncthreads();  // this tile's buffers are free for the prefetch after next
  }

  __syncthreads();
  float* ep = reinterpret_cast<float*>(&sm);
  acc_to_smem(dq, ep, p.scale);
  __syncthreads();
  smem_rows_to_bf16(ep, p.dq + tok * HEAD_DIM, (long long)p.hq * HEAD_DIM, rows, p.hadamard != 0);
}
