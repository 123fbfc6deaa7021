// Forward epilogue of a consumer warpgroup: O = O_stored * 2^(Evo - 8) / l in BF16 straight from
// the m64n{HEAD_DIM} accumulator fragment, and LSE = (m + log2 l) * ln 2 (FP32, natural log) per row.
#pragma once
#include "softmax.cuh"

// rowbase: packed token index of the fragment's row R0 (row r0 of this warpgroup), valid: rows
// of the warpgroup that belong to the document (rows at or past it are not written).
__device__ __forceinline__ void store_o_lse(const float (&o)[HEAD_DIM / 2], RowState& st, u16* out, float* lse, long long tok0,
                                            int heads, int h, int valid0, int valid8) {
  const int q = threadIdx.x & 3;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float l = st.l[r];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    const bool valid = r ? valid8 : valid0;
    const long long tok = tok0 + 8 * r;
    const float f = (l > 0.f ? 1.f / l : 0.f) * exp2i(st.evo[r] - 8);
    u16* orow = out + ((valid ? tok : tok0) * heads + h) * HEAD_DIM;
    store_frag_row_bf16(o, r, f, orow, valid);
    if (valid && q == 0) lse[tok * heads + h] = (st.m[r] + __log2f(l)) * LN2;
  }
}
