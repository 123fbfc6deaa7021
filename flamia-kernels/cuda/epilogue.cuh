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
// Bitwise the same values as store_o_lse (the same products, the same rounding): one
// stmatrix.x4 per 16 dims writes the fragment's rows g and g + 8 of two 8-dim blocks.
__device__ __forceinline__ void store_o_lse_tma(const float (&o)[HEAD_DIM / 2], RowState& st, float* lse, long long tok0, int heads,
                                                int h, u32 stage, const TmaMap* omap, int row0, int bar) {
  float f[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) f[r] = o_row_factor(st, r, lse, tok0 + 8 * r, heads, h, true);
  const int t = threadIdx.x & 127, lane = threadIdx.x & 31;
  if (t == 0) bulk_wait_read_all();  // the previous item's boxes have left the staging tiles
  named_sync(bar, 128);
  // this lane's stmatrix row: matrix m = lane / 8 is rows 16 w + 8 (m & 1) .. + 7 of block 2J + (m >> 1)
  const u32 row = 16 * (t >> 5) + (lane & 7) + 8 * ((lane >> 3) & 1), hi = lane >> 4;
#pragma unroll
  for (int J = 0; J < HEAD_DIM / 16; ++J) {
    const u32 blk = 2 * J + hi;  // 8-dim block: box blk / 8, 16-byte chunk blk % 8 of the row
    const u32 a = stage + (blk >> 3) * 8192u + row * 128u + (((blk & 7u) ^ (row & 7u)) << 4);
    stsm_x4(a, pack_bf16x2(o[8 * J] * f[0], o[8 * J + 1] * f[0]), pack_bf16x2(o[8 * J + 2] * f[1], o[8 * J + 3] * f[1]),
            pack_bf16x2(o[8 * J + 4] * f[0], o[8 * J + 5] * f[0]), pack_bf16x2(o[8 * J + 6] * f[1], o[8 * J + 7] * f[1]));
  }
  fence_async_smem();
  named_sync(bar, 128);
  if (t == 0) {
#pragma unroll
    for (int b = 0; b < HEAD_DIM / 64; ++b) tma_store_3d(omap, stage + 8192u * b, 64 * b, h, row0);
    bulk_commit();
  }
}
