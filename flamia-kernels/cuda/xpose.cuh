// Transposes of E4M3 code tiles in shared memory by warps: a token-major tile (row = token,
// HEAD_DIM bytes, the swizzle of that width: tok_off) into a dim-major one (row = dim, tokens along
// the row: what the FP8 wgmma takes as a K-major operand over tokens, or a TMA box of the
// dim-major layout in global memory), tokens at or past `nk` written as zeros. Users: the v4
// backward's dim-major K (BWD_KD_XPOSE 2, the consumers, per plan by default since session 23),
// the same backward's token-major V the other way round
// (BWD_VT_XPOSE, xpose_vt_half) and the v4 forward's copy of Q (FWD_QD_WRITE: d = 64, short and
// mid-length documents).
// Measured and removed: the forward's V per key-tile visit (FWD_VT, session 22, forward
// +16..+74%), the backward's Q and dO per step by one producer warp (BWD_QD_XPOSE, session 23,
// backward +7..+42%) and its K per item by one producer warp (BWD_KD_XPOSE 1, sessions 22-23,
// backward +3..+7%; removed in session 24 with its in-place 128 x 128 and 64-byte staging
// routines, commit 5614198). The caller fences the async proxy and publishes.
#pragma once
#include "tma.cuh"

// Two 16 x 16-byte blocks of a tile transposed through the warp's ldmatrix / stmatrix (16-bit
// transposes of 8 x 8 matrices; a PRMT per word finishes the bytes): 1 + 1 shared-memory
// instructions per 512 bytes instead of 64 four-byte ones. Block X = tokens 16 x1.., dims 16 x2..
// of the token-major tile (address soff(token, byte)) goes to dims 16 x2.., positions 16 x1.. of
// the dim-major one (doff(dim, position)); block Y likewise with (y1, y2). Position p of a
// 16-position group holds token p, or in `order` XPOSE_QPERM the token BWD_QPERM's order puts
// there (positions 4m + c: token 2m + {0, 1, 8, 9}[c], quant.cu dim_token), in XPOSE_ILEAVE
// token p / 2 + 8 (p % 2) (BWD_DS_STSM's key order). Matrix rows (16 bytes):
// ldmatrix's M0 / M1 of a block hold tokens K0 = {0,1,4,5,10,11,14,15} / K1 = the other eight
// (XPOSE_QPERM and XPOSE_ILEAVE: 0..7 / 8..15), so that after .trans lane t (q = t % 4, g = t / 4) holds the tokens
// of positions 4q..4q+3 for dims 2g and 2g+1 across its two registers; stmatrix's N0 / N1 rows
// are dims 2g + s / 2g + 1 - s, s = g / 4. Both choices put a matrix's 8 rows on 8 distinct
// 16-byte bank groups of the 128- and 64-byte swizzles (no conflicts). Tokens at or past `nk`
// become zeros. `python3 scripts/xpose_model.py` models the instructions' fragment layouts and
// checks the tiles bit for bit (session 22; on the GPU bitwise the quantiser's copies since
// session 23). In two halves, so that a caller can have several pairs' loads in flight before
// the first store (xpose_kd_half): xpose_ldsm_load reads blocks X and Y into m, xpose_ldsm_store
// writes them; xpose_blocks_ldsm does both.
// Position orders of a 16-position group (`order`): XPOSE_PLAIN position p holds token p;
// XPOSE_QPERM BWD_QPERM's (above); XPOSE_ILEAVE position 2i holds token i and 2i + 1 token i + 8
// (BWD_DS_STSM's key order: a consumer thread's keys g and g + 8 of the dS tile side by side).
#define XPOSE_PLAIN 0
#define XPOSE_QPERM 1
#define XPOSE_ILEAVE 2
template <class SrcOff>
__device__ __forceinline__ void xpose_ldsm_load(const u8* src, SrcOff soff, int x1, int x2, int y1, int y2, int order, int lane,
                                                u32 (&m)[4]) {
  const int j = lane >> 3, r = lane & 7;
  const int kap = order ? r + 8 * (j & 1) : (r & 1) + 4 * (r >> 1) + 2 * (((r >> 2) & 1) ^ (j & 1));  // M_j's row r
  const int xa = j < 2 ? x1 : y1, xb = j < 2 ? x2 : y2;
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(m[0]), "=r"(m[1]), "=r"(m[2]), "=r"(m[3])
               : "r"(smem_u32(src + soff(16 * xa + kap, 16 * xb)))
               : "memory");
}

// `rows_qperm` (xpose_vt_half with V's dim-major copy in BWD_QPERM's order, BWD_VT_VPERM): the
// source's byte position p of a 16-byte group holds token qperm(p) (the 16-bit pair p / 2 holds
// token pair (p / 2) / 2 + 4 ((p / 2) & 1)), so destination row rho, which receives position rho,
// becomes row qperm(rho): the pairs stay whole, only the stmatrix row addresses move.
template <class DstOff>
__device__ __forceinline__ void xpose_ldsm_store(u8* dst, DstOff doff, int x1, int x2, int y1, int y2, int nk, int order, int lane,
                                                 const u32 (&m)[4], bool rows_qperm = false) {
  const int j = lane >> 3, r = lane & 7, q = lane & 3, g = lane >> 2;
  const int xa = j < 2 ? x1 : y1, xb = j < 2 ? x2 : y2;
  const bool swap = !order && (q >> 1);  // plain order, q >= 2: the word's first tokens are M1's
  // dims 2g, 2g + 1: plain / XPOSE_QPERM bytes (M0 t, M0 t + 1, M1 t, M1 t + 1); XPOSE_ILEAVE
  // (M0 t, M1 t, M0 t + 1, M1 t + 1), M1's rows being tokens 8.. there
  const u32 s0 = order == XPOSE_ILEAVE ? 0x6240u : swap ? 0x2064u : 0x6420u;
  const u32 s1 = order == XPOSE_ILEAVE ? 0x7351u : swap ? 0x3175u : 0x7531u;
  const int sg = (g >> 2) & 1;
  u32 o[4];
#pragma unroll
  for (int b = 0; b < 2; ++b) {
    const int t0 = 16 * (b ? y1 : x1) + (order ? 2 * q : 4 * q);  // the word's first token
    u32 keep = 0u;  // bytes of tokens inside the document (XPOSE_QPERM: tokens t0, +1, +8, +9;
                    // XPOSE_ILEAVE: t0, +8, +1, +9)
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const int tok = t0 + (order == XPOSE_QPERM ? (c & 1) + 8 * (c >> 1) : order == XPOSE_ILEAVE ? (c >> 1) + 8 * (c & 1) : c);
      keep |= (tok < nk ? 0xffu : 0u) << (8 * c);
    }
    const u32 w0 = __byte_perm(m[2 * b], m[2 * b + 1], s0) & keep, w1 = __byte_perm(m[2 * b], m[2 * b + 1], s1) & keep;
    o[2 * b] = sg ? w1 : w0;
    o[2 * b + 1] = sg ? w0 : w1;
  }
  const int rho0 = 2 * r + (((r >> 2) & 1) ^ (j & 1));  // N_j's row r: its dim
  const int rho = rows_qperm ? 8 * ((rho0 >> 1) & 1) + 2 * ((rho0 >> 2) & 3) + (rho0 & 1) : rho0;
  const u32 d = smem_u32(dst + doff(16 * xb + rho, 16 * xa));
  stsm_x4(d, o[0], o[1], o[2], o[3]);
}

template <class SrcOff, class DstOff>
__device__ __forceinline__ void xpose_blocks_ldsm(const u8* src, u8* dst, SrcOff soff, DstOff doff, int x1, int x2, int y1,
                                                  int y2, int nk, int order, int lane) {
  u32 m[4];
  xpose_ldsm_load(src, soff, x1, x2, y1, y2, order, lane, m);
  xpose_ldsm_store(dst, doff, x1, x2, y1, y2, nk, order, lane, m);
}

// BWD_KD_XPOSE 2 (the v4 backward's consumers, at their item's start): consumer warpgroup
// `half`'s HEAD_DIM / 2 dims of the dim-major K tile (row = dim, 128 keys, 128-byte swizzle:
// exactly the rows its dQ products read) from the token-major K tile (tok_off), out of place,
// by warp w of its four: pair p (blocks X = tokens 16a.., dims 16(half HEAD_DIM / 32 + 2c)..,
// Y = the next 16 dims; a = p / (HEAD_DIM / 64), c = p % (HEAD_DIM / 64)) for the warp's NP =
// HEAD_DIM / 32 pairs p = NP w.., all NP loads issued before the first store (no dependency
// between the pairs: the loads' latencies overlap). 4 + 4 shared-memory instructions per warp
// at d = 128, 2 + 2 at 64.
__device__ __forceinline__ void xpose_kd_half(const u8* src, u8* dst, int half, int w, int nk, int lane, int order) {
  constexpr int NP = HEAD_DIM / 32, PC = HEAD_DIM / 64;  // pairs per warp, pairs per token block
  const auto so = [](int row, int byte) { return tok_off(row, byte); };
  const auto d128 = [](int row, int byte) { return sw128_off(row, byte); };
  // pair i of the warp: token block a, dim blocks b and b + 1
  const auto a_of = [&](int i) { return (NP * w + i) / PC; };
  const auto b_of = [&](int i) { return half * (HEAD_DIM / 32) + 2 * ((NP * w + i) % PC); };
  u32 m[NP][4];
#pragma unroll
  for (int i = 0; i < NP; ++i) xpose_ldsm_load(src, so, a_of(i), b_of(i), a_of(i), b_of(i) + 1, order, lane, m[i]);
#pragma unroll
  for (int i = 0; i < NP; ++i) xpose_ldsm_store(dst, d128, a_of(i), b_of(i), a_of(i), b_of(i) + 1, nk, order, lane, m[i]);
}

// BWD_VT_XPOSE (the v4 backward's consumers, at their item's start): the K/V slot's V tile
// arrives dim-major, as two 64-key halves (the producer's two TMA boxes of the 64-byte swizzle:
// half c = [HEAD_DIM dims][keys 64c..64c+63] at byte HEAD_DIM * 64 c), and each consumer
// warpgroup transposes its own half IN PLACE into its 64 rows of the token-major tile (row =
// key, tok_off) that its dP products read: half c occupies exactly the bytes of token-major rows
// 64c.., so the two warpgroups never touch each other's bytes and sync only among their own 128
// threads (`bar`: between every load and any store, the layouts differ in shape). Warp w of
// warpgroup `half`: key block w (16 keys) for all HEAD_DIM dims, NP = HEAD_DIM / 32 pairs (blocks
// X = dims 32i.., Y = the next 16 dims). No masking: the keys past the document are whatever the
// padded dim-major layout holds there (zeros up to the document's next multiple of 64 positions,
// then the next document's codes), where the token-major copy held the next document's tokens:
// both only ever meet a masked score (P = +0). 4 + 4 shared-memory instructions per warp at
// d = 128, 2 + 2 at 64. The caller fences the async proxy and publishes (the stores must reach
// this warpgroup's dP products). `vperm` (BWD_VT_VPERM: V's dim-major copy in BWD_QPERM's key
// order within each 32-key block, the v4 forward's FWD_VPERM): each key is put back in its own
// token-major row (xpose_ldsm_store's rows_qperm; its stores then meet 2-way bank conflicts, a
// few dozen clocks an item). `python3 scripts/xpose_model.py` checks the bytes and that a
// warpgroup's loads and stores stay inside its half.
__device__ __forceinline__ void xpose_vt_half(u8* v, int half, int w, int lane, int bar, bool vperm) {
  constexpr int NP = HEAD_DIM / 32;
  u8* t = v + half * (64 * HEAD_DIM);
  const auto s64 = [](int row, int byte) { return sw64_off(row, byte); };
  const auto to = [](int row, int byte) { return tok_off(row, byte); };
  u32 m[NP][4];
#pragma unroll
  for (int i = 0; i < NP; ++i) xpose_ldsm_load(t, s64, 2 * i, w, 2 * i + 1, w, false, lane, m[i]);
  named_sync(bar, 128);
#pragma unroll
  for (int i = 0; i < NP; ++i) xpose_ldsm_store(t, to, 2 * i, w, 2 * i + 1, w, HEAD_DIM, false, lane, m[i], vperm);
}
