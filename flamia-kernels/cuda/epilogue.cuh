// Forward epilogue of a consumer warpgroup: O = O_stored * 2^(Evo - 8) / l in BF16 straight from
// the m64n{HEAD_DIM} accumulator fragment, and LSE = (m + log2 l) * ln 2 (FP32, natural log) per row.
#pragma once
#include "softmax.cuh"
#include "tma.cuh"

// Row r's output factor 2^(Evo - 8) / l (l reduced over the quad) and its LSE (stored by the
// quad's first lane when `valid`).
__device__ __forceinline__ float o_row_factor(const RowState& st, int r, float* lse, long long tok, int heads, int h, bool valid) {
  float l = st.l[r];
  l += __shfl_xor_sync(0xffffffffu, l, 1);
  l += __shfl_xor_sync(0xffffffffu, l, 2);
  if (valid && (threadIdx.x & 3) == 0) lse[tok * heads + h] = (st.m[r] + __log2f(l)) * LN2;
  return (l > 0.f ? 1.f / l : 0.f) * exp2i(st.evo[r] - 8);
}

// tok0: packed token index of the fragment's row R0 (row r0 of this warpgroup), valid: rows
// of the warpgroup that belong to the document (rows at or past it are not written).
__device__ __forceinline__ void store_o_lse(const float (&o)[HEAD_DIM / 2], RowState& st, u16* out, float* lse, long long tok0,
                                            int heads, int h, int valid0, int valid8) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const bool valid = r ? valid8 : valid0;
    const long long tok = tok0 + 8 * r;
    const float f = o_row_factor(st, r, lse, tok, heads, h, valid);
    u16* orow = out + ((valid ? tok : tok0) * heads + h) * HEAD_DIM;
    store_frag_row_bf16(o, r, f, orow, valid);
  }
}

// FWD_O_TMA: a warpgroup whose 64 rows all lie in the document writes O through shared memory
// and one bulk tensor store per 64 dims, so its item ends once the tile is in shared memory
// instead of once its 16 KB (d = 128) of global stores have left the SM (the next item's key
// tiles run while the TMA unit drains them). `stage`: the warpgroup's HEAD_DIM / 64 staging
// boxes of 64 rows x 128 bytes (64 BF16 dims, 128-byte swizzle, 1024-byte aligned), the O map's
// box; `bar` a named barrier of the warpgroup's 128 threads; `row0` the token of its row 0.
// Bitwise the same values as store_o_lse (the same products, the same rounding:
// stage_frag_bf16_sw128, common.cuh).
__device__ __forceinline__ void store_o_lse_tma(const float (&o)[HEAD_DIM / 2], RowState& st, float* lse, long long tok0, int heads,
                                                int h, u32 stage, const TmaMap* omap, int row0, int bar) {
  float f[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) f[r] = o_row_factor(st, r, lse, tok0 + 8 * r, heads, h, true);
  const int t = threadIdx.x & 127, lane = threadIdx.x & 31;
  if (t == 0) bulk_wait_read_all();  // the previous item's boxes have left the staging tiles
  named_sync(bar, 128);
  stage_frag_bf16_sw128(o, f, stage, t, lane);
  fence_async_smem();
  named_sync(bar, 128);
  if (t == 0) {
#pragma unroll
    for (int b = 0; b < HEAD_DIM / 64; ++b) tma_store_3d(omap, stage + 8192u * b, 64 * b, h, row0);
    bulk_commit();
  }
}
