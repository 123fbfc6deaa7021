// Online softmax of one 64 x 128 score tile of a consumer warpgroup, with FLAMIA's block scales
// folded so that an interior score costs one FFMA and one ex2 (plus its max, its sum and its share
// of the E4M3 conversion). Accumulator fragment of m64n128 (thread t, w = t/32, g = lane/4,
// q = lane%4): s[i] = row 16w + g + 8*((i>>1)&1), column 8*(i>>2) + 2q + (i&1), so columns
// 32G..32G+31 (key group G) are i in [16G, 16G + 16).
//
// Token-block scales (default; also the tensor-wide exponent of leaky-fp8): the exponents of K and
// V are uniform over each aligned 32-key group (key tiles start at a document start + a multiple
// of 128 and blocks restart at every document start), so with qf = 2^eQ * scale * log2(e):
//   x_ij  = s_ij * qf_i * 2^eK_G                       (c_iG = qf_i * 2^eK_G, one per row and group)
//   m_i   = max_j x_ij = max_G c_iG * max_{j in G} s_ij    (c > 0: raw maxima first, 1 FMNMX a score)
//   P'_ij = exp2(fma(s_ij, c_iG, fe_iG - m_i))         (1 FFMA + 1 MUFU a score)
//   fe_iG = max(eV_G - Ev_i + 8, -20): V's exponent folded into P's E4M3 quantisation (the PV
//           product then needs one factor 2^(Ev_i - 8) per row); Ev_i = max eV over the groups row i
//           sees (a masked key never moves it: causal safety). Below -20 every P' rounds to E4M3
//           zero anyway, and the clamp keeps the row sum exact: l_i += 2^-fe_iG * sum_{j in G} P'_ij.
// Not kept (session 34, commit 7cabe7c has it): FA4's trick, part of the interior tiles' exp2 by
// a polynomial on the FMA pipe (degree 4 after a round-to-integer split, within 3 ulp): 8 or 16
// of a thread's 64 scores measured the forward +2.8% / +3.9% at 1x65536 and slower at 64x1024,
// with the accuracy tests passing. The softmax's ex2 are not what bounds it (MUFU busy ~1,000 of
// ~2,700 clocks per tile and SMSP); every instruction added to the tile costs time.
// Per-token scales (PER_TOKEN_COLS = 1, the per_token_scales option): a factor per key column, the
// fold per column, the row sum of unfolded P (the v3.1 arithmetic).
//
// O is kept in units of 2^(Evo_i - 8) (Evo: the fold of the last tile), so the per-tile update is
// one FFMA per O element: O = O * alpha_o + PV with alpha_o = exp2(m_old - m_new) * 2^(Evo - Ev).
#pragma once
#include "attn_common.cuh"

#ifndef PER_TOKEN_COLS
#define PER_TOKEN_COLS 0
#endif
#define KT 128  // keys per tile (the m64n128 score fragment above)

// Visibility of (row R of the 128-row query tile, key column c of the 128-key tile).
struct TileMask {
  int kval;    // valid keys in the tile (document end)
  int rows;    // valid query rows of the query tile
  int dq;      // q0 - k0: key c is causally visible to row R iff c <= R + dq
  int causal;
  // Last visible column of row R (-1: none). Visibility is a prefix of the columns.
  __device__ __forceinline__ int last(int R) const {
    return R < rows ? (causal ? min(kval - 1, R + dq) : kval - 1) : -1;
  }
};

// Softmax state of the two rows (r0, r0 + 8) a thread owns.
struct RowState {
  float m[2];    // running max (log2 domain, scaled)
  float l[2];    // this thread's share of the row sum (reduced over the quad at the end)
  int evo[2];    // O's current unit exponent (+8)
  float qf[2];   // 2^eQ * scale * log2(e)
};


// Two adjacent floats (or ints) of shared memory at an 8-byte aligned address in one 8-byte load.
// The per-token path's per-key tables give a thread keys 8j + 2q and + 1 side by side; a plain
// float2 load whose halves feed different scores was split into two 4-byte LDS (session 37's
// census). Volatile, so it stays behind the stage's barrier wait like the loads it replaces.
// `a`: the shared-memory address (smem_u32), made once per table so the offsets fold into the loads.
__device__ __forceinline__ float2 lds_f2(u32 a) {
  float2 v;
  asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];\n" : "=f"(v.x), "=f"(v.y) : "r"(a));
  return v;
}

// FWD_TILE_TRIM 1 (the host's default since session 43; FLAMIA_FWD_TILE_TRIM=0 switches it off):
// two cuts of the interior key tile that keep every value. update_max takes mref = max(mn,
// -FLT_MAX) on an interior tile instead of testing for -inf (no mask there, so mn is -inf only
// when every scaled score of the row overflowed to -inf, huge inputs: then alpha is 0 either way
// and every fma(s, cf, fe + FLT_MAX) is below -2^103, so each P' is +0 as with mref = 0; a
// finite mn is itself; a review found the first version, mref = mn, gave NaN there); the
// token-block producer writes each 32-key group's 2^eK and eV into the first four entries of the
// stage's tables (not at key 32 G) and group_keys reads them by one 16-byte load each. 2 + 6 SASS
// fewer per interior key tile.
#ifndef FWD_TILE_TRIM
#define FWD_TILE_TRIM 0
#endif
// FWD_EV_RUN 1 (session 41; the host's default since session 43, FLAMIA_FWD_EV_RUN=0 switches it
// off): V's fold reference Ev is the running maximum of eV over the groups the row has seen so far
// (Ev = max(Ev of the earlier tiles, this tile's)), the reference's rule (reference/fwd.rs, since
// session 43), instead of this tile's own maximum. O's unit factor 2^(Ev_old - Ev) is then <= 1: with the tile's own maximum, a tile
// whose visible V blocks are all zero (eV -126) would multiply O by ~2^120 and overflow f32 (a
// review's finding; GPU test spread_block_scales_and_zero_value_tiles_are_as_accurate_as_the_
// reference). One integer max per row and tile. Per-token scales: the producer keeps the
// running maximum for the interior tiles' per-key folds (sm.evt, sm.vf: attn_fwd_v4.cu), the
// masked tiles take each row's as the token-block path does. RowState.evo starts at -1000 (no
// group seen yet).
#ifndef FWD_EV_RUN
#define FWD_EV_RUN 0
#endif
// New running max of each row from its tile maximum; alpha = exp2(m_old - m_new); mref = the
// value subtracted (0 for a row with no visible key yet, so exp2 sees -inf, never NaN; FINITE:
// an interior tile, FWD_TILE_TRIM: -FLT_MAX for such a row, the same P', alpha and sums).
template <bool FINITE = false>
__device__ __forceinline__ void update_max(RowState& st, const float (&tmax)[2], float (&alpha)[2], float (&mref)[2]) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float mn = fmaxf(st.m[r], quad_max(tmax[r]));
    mref[r] = FINITE ? fmaxf(mn, -3.402823466e38f) : (mn == NEG_INF ? 0.f : mn);
    alpha[r] = fast_exp2(st.m[r] - mref[r]);
    st.m[r] = mn;
  }
}

// FWD_FACTORS_FIRST (token-block scales; the default per head dim, as measured): 1 (d = 128) the
// tile's factors that need no score (tile_factors: the folds cf, Ev, V's folds fe, the mask
// limits) made before the groups' maxima, which are trees, fe kept as an int and the row sums'
// 2^-fe on interior tiles without exp2i's clamp (session 37); 0 (d = 64) session 36's order: cf
// and Ev made with the tile maximum, fe after it, the groups' maxima as chains. The same values
// either way (bitwise the same O and LSE). Measured (session 38, same calls, two rounds each,
// forward ms at 1x65536): d = 128 22.55-22.80 with 1 against 22.89-23.11 with 0 (four calls);
// d = 64 19.0 with 1 against 17.6 with 0 (4x16384 4.81-4.84 against 4.51-4.54); on 1, the clamp
// back gave 18.52-18.60 and also fe after the maximum 18.12-18.14. Session 38 also measured these
// factors made before S's wait (session 36's FWD_EARLY_CF 1 and 2, on 1): d = 128 -0.6..+1.0%,
// d = 64 +1.4..+5%: removed.
#ifndef FWD_FACTORS_FIRST
#define FWD_FACTORS_FIRST (HEAD_DIM == 128)
#endif
#if !PER_TOKEN_COLS
// P' = ex2(s cf + bias) per score in place (cf and bias per row and 32-key group), and each row's
// and group's sum of them (a masked score, -inf, gives 0).
template <int NS, int NG>
__device__ __forceinline__ void group_exp2(float (&s)[NS], const float (&cf)[2][NG], const float (&bias)[2][NG],
                                           float (&ps)[2][NG]) {
#pragma unroll
  for (int i = 0; i < NS; ++i) {
    const int r = (i >> 1) & 1, G = i >> 4;
    const float p = fast_exp2(fmaf(s[i], cf[r][G], bias[r][G]));
    ps[r][G] += p;
    s[i] = p;
  }
}
// Each 32-key group's 2^eK and eV (token-block scales: uniform over the group), from the stage's
// per-key tables in shared memory.
template <int NG>
__device__ __forceinline__ void group_keys(const float* kf, const int* ev, float (&kg)[NG], int (&eg)[NG]) {
#if FWD_TILE_TRIM
  // (the producer's compact tables: entries 0..3; a half tile's two groups read the first two)
  const float4 k4 = *reinterpret_cast<const float4*>(kf);
  const int4 e4 = *reinterpret_cast<const int4*>(ev);
  const float kv[4] = {k4.x, k4.y, k4.z, k4.w};
  const int evv[4] = {e4.x, e4.y, e4.z, e4.w};
#pragma unroll
  for (int G = 0; G < NG; ++G) {
    kg[G] = kv[G];
    eg[G] = evv[G];
  }
#else
#pragma unroll
  for (int G = 0; G < NG; ++G) {
    kg[G] = kf[32 * G];
    eg[G] = ev[32 * G];
  }
#endif
}
#endif

#if !PER_TOKEN_COLS && FWD_FACTORS_FIRST
// What one tile's softmax needs of its keys and rows but not of its scores (token-block scales):
// per row and 32-key group G the fold cf = qf 2^eK_G (floored at 1e-30 so a masked -inf times
// cf is -inf, never NaN: cf = 0 for a row past the document, a key group past it, or an
// underflowing product; below 1e-30 every x = s * cf is within 3e-23 of zero either way, |s| <=
// 448^2 * 128, so no result moves), Ev (max eV over the groups the row sees: a group is visible
// iff its first key is, visibility being a prefix of the columns; a masked key never moves it),
// V's fold fe = max(eV_G - Ev + 8, -20), and the rows' mask limits lq (element i of row r is
// visible iff 8 * (i >> 2) + (i & 1) <= lq[r]: one compare with an immediate per score).
// (A struct filled by a function rather than locals of softmax_tile: written inline, ptxas
// allocated registers differently and the SASS was no longer the build session 38 measured.)
template <int NS>
struct TileFactors {
  float cf[2][NS / 16];
  int fe[2][NS / 16];  // (an int: the bias takes it as a float, the row sum's 2^-fe as it is)
  int Ev[2];
  int lq[2];
};
template <bool MASKED, int NS = 64>
__device__ __forceinline__ void tile_factors(TileFactors<NS>& f, const RowState& st, const float* kf, const int* ev, int R0,
                                             const TileMask& mk) {
  constexpr int NG = NS / 16;  // 32-key groups
  const int q = threadIdx.x & 3;
  float kg[NG];
  int eg[NG];
  group_keys(kf, ev, kg, eg);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int lim = MASKED ? mk.last(R0 + 8 * r) : KT - 1;
    f.lq[r] = lim - 2 * q;
    f.Ev[r] = -1000;
#pragma unroll
    for (int G = 0; G < NG; ++G) {
      f.cf[r][G] = fmaxf(st.qf[r] * kg[G], 1e-30f);
      const bool vis = MASKED ? 32 * G <= lim : true;
      f.Ev[r] = max(f.Ev[r], vis ? eg[G] : -1000);
    }
    // (the groups of the earlier tiles; the interior tiles are a prefix every row of the
    // warpgroup sees whole, so there both rows' running maxima are equal: row 0's serves both
    // and the folds stay per group, not per row and group)
    if (FWD_EV_RUN) f.Ev[r] = max(f.Ev[r], MASKED ? st.evo[r] : st.evo[0]);
#pragma unroll
    for (int G = 0; G < NG; ++G) {
      f.fe[r][G] = max(eg[G] - f.Ev[r] + 8, -20);
    }
  }
}
#endif

// One score tile -> P' (in place, ready for the E4M3 conversion), the row state updated and the
// factor alpha_o each O row is multiplied by before this tile's PV is added. kf / ev: 2^eK and eV
// per key of the tile (shared memory); R0 = row of s[0] in the 128-row query tile.
// vf / evt (per-token scales only): the producer's per-key fold 2^(eV_c - evt + 8) and evt, the
// tile's max eV (FWD_EV_RUN: the max over the item's tiles so far), which on an interior tile
// (every row sees every key, and every earlier tile) are exactly each row's Ev and fold.
// NS: scores per thread, 64 (the 128-key tile) or 32 (its first 64 keys only: a masked tile no
// row of the warpgroup sees past key 63, FWD_HALF_TILES; the 32 elements are the first 32 of
// the full tile's, and the skipped keys would have added exact zeros, so the same bits).
// Token-block scales: in the order FWD_FACTORS_FIRST says (tile_factors for 1).
template <bool MASKED, int NS = 64>
__device__ __forceinline__ void softmax_tile(float (&s)[NS], RowState& st, const float* kf, const int* ev, const float* vf,
                                             int evt, int R0, const TileMask& mk, float (&alpha_o)[2]) {
  static_assert(NS == 64 || (NS == 32 && MASKED), "softmax_tile: 64 scores, or 32 on a masked tile");
  float alpha[2], mref[2];
  int Ev[2];
#if !PER_TOKEN_COLS && FWD_FACTORS_FIRST
  constexpr int NG = NS / 16;  // 32-key groups
  TileFactors<NS> f;
  tile_factors<MASKED, NS>(f, st, kf, ev, R0, mk);
#pragma unroll
  for (int i = 0; i < NS; ++i) {
    const int r = (i >> 1) & 1;
    if (MASKED) s[i] = (8 * (i >> 2) + (i & 1) <= f.lq[r]) ? s[i] : NEG_INF;  // ex2 gives 0 below
  }
  // each row's raw maximum per group: its 8 scores (i = 16 G + 4 k + 2 r + b) as a tree, 7 FMNMX
  // of depth 3 (a chain from -inf took 8 of depth 8; fmaxf drops NaN either way, and a group of
  // NaN alone gives NaN here where the chain gave -inf, which the tile maximum's fmaxf ignores
  // just the same: the same bits)
  float gm[2][NG];
#pragma unroll
  for (int r = 0; r < 2; ++r)
#pragma unroll
    for (int G = 0; G < NG; ++G) {
      float t[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) t[k] = fmaxf(s[16 * G + 4 * k + 2 * r], s[16 * G + 4 * k + 2 * r + 1]);
      gm[r][G] = fmaxf(fmaxf(t[0], t[1]), fmaxf(t[2], t[3]));
    }
  float tmax[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    tmax[r] = NEG_INF;
    Ev[r] = f.Ev[r];
#pragma unroll
    for (int G = 0; G < NG; ++G) tmax[r] = fmaxf(tmax[r], gm[r][G] * f.cf[r][G]);  // -inf * 0 = NaN is ignored by fmaxf
  }
  update_max<FWD_TILE_TRIM && !MASKED>(st, tmax, alpha, mref);
  float bias[2][NG], ps[2][NG];
#pragma unroll
  for (int r = 0; r < 2; ++r)
#pragma unroll
    for (int G = 0; G < NG; ++G) {
      bias[r][G] = (float)f.fe[r][G] - mref[r];
      ps[r][G] = 0.f;
    }
  group_exp2(s, f.cf, bias, ps);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float sum = 0.f;
#pragma unroll
    for (int G = 0; G < NG; ++G)
      sum = fmaf(ps[r][G], MASKED ? exp2i(-f.fe[r][G]) : exp2i_inrange(-f.fe[r][G]), sum);
    st.l[r] = fmaf(st.l[r], alpha[r], sum);
  }
#elif !PER_TOKEN_COLS
  // (session 36's order, FWD_FACTORS_FIRST 0: the folds above made with the tile maximum)
  constexpr int NG = NS / 16;  // 32-key groups
  const int q = threadIdx.x & 3;
  float kg[NG];
  int eg[NG];
  group_keys(kf, ev, kg, eg);
  int lim[2], lq[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    lim[r] = MASKED ? mk.last(R0 + 8 * r) : KT - 1;
    lq[r] = lim[r] - 2 * q;
  }
  float gm[2][NG];
#pragma unroll
  for (int r = 0; r < 2; ++r)
#pragma unroll
    for (int G = 0; G < NG; ++G) gm[r][G] = NEG_INF;
#pragma unroll
  for (int i = 0; i < NS; ++i) {
    const int r = (i >> 1) & 1, G = i >> 4;
    if (MASKED) s[i] = (8 * (i >> 2) + (i & 1) <= lq[r]) ? s[i] : NEG_INF;  // ex2 gives 0 below
    gm[r][G] = fmaxf(gm[r][G], s[i]);
  }
  float cf[2][NG], tmax[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    tmax[r] = NEG_INF;
    Ev[r] = -1000;
#pragma unroll
    for (int G = 0; G < NG; ++G) {
      cf[r][G] = fmaxf(st.qf[r] * kg[G], 1e-30f);
      tmax[r] = fmaxf(tmax[r], gm[r][G] * cf[r][G]);  // -inf * 0 = NaN is ignored by fmaxf
      Ev[r] = max(Ev[r], (MASKED ? 32 * G <= lim[r] : true) ? eg[G] : -1000);
    }
    if (FWD_EV_RUN) Ev[r] = max(Ev[r], MASKED ? st.evo[r] : st.evo[0]);  // (as tile_factors)
  }
  update_max<FWD_TILE_TRIM && !MASKED>(st, tmax, alpha, mref);
  float fe[2][NG], bias[2][NG], ps[2][NG];
#pragma unroll
  for (int r = 0; r < 2; ++r)
#pragma unroll
    for (int G = 0; G < NG; ++G) {
      fe[r][G] = (float)max(eg[G] - Ev[r] + 8, -20);
      bias[r][G] = fe[r][G] - mref[r];
      ps[r][G] = 0.f;
    }
  group_exp2(s, cf, bias, ps);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float sum = 0.f;
#pragma unroll
    for (int G = 0; G < NG; ++G) sum = fmaf(ps[r][G], exp2i(-(int)fe[r][G]), sum);
    st.l[r] = fmaf(st.l[r], alpha[r], sum);
  }
#else
  const int q = threadIdx.x & 3;
  // The row maxima are taken of y = s 2^eK and scaled by the row's qf once: qf >= 0 and rounding
  // is monotonic, so max RN(y qf) = RN(qf max y), bit for bit (one FMUL a row, not a score); a
  // row whose scores are all masked keeps -inf (-inf * 0 would be NaN for a row past the
  // document, whose qf is 0).
  float tmax[2] = {NEG_INF, NEG_INF};
  if (!MASKED) {  // interior: Ev = evt for both rows, the fold per key from the producer
    Ev[0] = Ev[1] = evt;
    const u32 ka = smem_u32(kf + 2 * q), va = smem_u32(vf + 2 * q);
#pragma unroll
    for (int j = 0; j < NS / 4; ++j) {  // (keys 8j + 2q, +1: one 8-byte load)
      const float2 k2 = lds_f2(ka + 32 * j);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int i = 4 * j + e, r = e >> 1;
        const float y = s[i] * ((e & 1) ? k2.y : k2.x);
        s[i] = y;
        tmax[r] = fmaxf(tmax[r], y);
      }
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) tmax[r] = tmax[r] == NEG_INF ? NEG_INF : tmax[r] * st.qf[r];
    update_max<FWD_TILE_TRIM>(st, tmax, alpha, mref);  // (the interior tile)
    float ps[2] = {0.f, 0.f};
#pragma unroll
    for (int j = 0; j < NS / 4; ++j) {
      const float2 v2 = lds_f2(va + 32 * j);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int i = 4 * j + e, r = e >> 1;
        const float p = fast_exp2(fmaf(s[i], st.qf[r], -mref[r]));
        ps[r] += p;
        s[i] = p * ((e & 1) ? v2.y : v2.x);
      }
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) st.l[r] = fmaf(st.l[r], alpha[r], ps[r]);
  } else {
  Ev[0] = Ev[1] = -1000;
  int lq[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) lq[r] = (MASKED ? mk.last(R0 + 8 * r) : KT - 1) - 2 * q;
#pragma unroll
  for (int i = 0; i < NS; ++i) {
    const int r = (i >> 1) & 1, c = 8 * (i >> 2) + 2 * q + (i & 1);
    const bool ok = MASKED ? 8 * (i >> 2) + (i & 1) <= lq[r] : true;
    const float y = s[i] * kf[c];
    s[i] = y;
    tmax[r] = fmaxf(tmax[r], ok ? y : NEG_INF);
    Ev[r] = max(Ev[r], ok ? ev[c] : -1000);
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) tmax[r] = tmax[r] == NEG_INF ? NEG_INF : tmax[r] * st.qf[r];
  Ev[0] = quad_max_i(Ev[0]);
  Ev[1] = quad_max_i(Ev[1]);
  if (FWD_EV_RUN) {  // (with the interior tiles' running maximum: the keys seen before this tile)
    Ev[0] = max(Ev[0], st.evo[0]);
    Ev[1] = max(Ev[1], st.evo[1]);
  }
  update_max<FWD_TILE_TRIM && !MASKED>(st, tmax, alpha, mref);
  float ps[2] = {0.f, 0.f};
#pragma unroll
  for (int i = 0; i < NS; ++i) {
    const int r = (i >> 1) & 1, c = 8 * (i >> 2) + 2 * q + (i & 1);
    float p = fast_exp2(fmaf(s[i], st.qf[r], -mref[r]));
    if (MASKED) p = (8 * (i >> 2) + (i & 1) <= lq[r]) ? p : 0.f;
    ps[r] += p;
    s[i] = p * exp2i(ev[c] - Ev[r] + 8);
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) st.l[r] = fmaf(st.l[r], alpha[r], ps[r]);
  }
#endif
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    alpha_o[r] = alpha[r] * exp2i(st.evo[r] - Ev[r]);
    st.evo[r] = Ev[r];
  }
}
