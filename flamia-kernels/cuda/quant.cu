// Fused E4M3 quantiser: ONE launch for up to three input tensors (Q, K and V of a forward call;
// dO alone in the backward). For every (32-token block of one document, head, input) it does the
// optional Hadamard rotation (per input), the amax, the exponent, the E4M3 codes in both layouts
// the attention kernels read (token-major and dim-major, see attn_common.cuh) and the per-token
// exponent table; for dO (DELTA) also D_i = dO_hat_i . O_i (FP32, [T, H]) from the quantised dO.
//
// Head dim d = HEAD_DIM (common.cuh; 64 or 128, a variant define): NK = d / 32 chunks of 32
// elements per row.
// Memory-bound, so the layout is chosen for bytes in flight and full-sector accesses:
// - Persistent grid (as many CTAs of 128 threads per SM as fit: QUANT_CTAS_PER_SM in the
//   __launch_bounds__, the host asks the driver), items taken grid-stride, head slots fastest (consecutive items read
//   adjacent 2d-byte rows); each CTA loads the NEXT item's 64 d bytes while it computes the current one.
// - Thread (row tt = tid / 4, quarter q = tid % 4) owns 8 NK elements of one token row:
//   element i = 32 k + 8 q + j (k = 0..NK-1, j = 0..7), loaded as NK 16-byte vectors.
//   Hadamard stages h = 1, 2, 4 (bits of j) and 32 (bit 0 of k; d = 128: also 64, bit 1 of k)
//   run in registers, h = 8, 16 (bits of q) through two shuffle stages: 2 shuffles per element
//   instead of 5.
// - Token-major codes: 8-byte stores, 4 lanes = one 32-byte sector of a row.
// - Dim-major codes, by chunk: items are (128-position chunk of the padded dim-major layout,
//   head slot), Tpad a multiple of 128 (PlanTables::chunks). A CTA runs the chunk's up to four
//   32-token blocks in turn; each block's 32 x d code tile goes through shared memory (rows of 32
//   words, words w < d / 4 used; XOR-swizzled, conflict-free for the row writes and the column
//   reads), thread (dim quad g, token octet s) transposes two 4x4 byte squares with PRMT into the
//   chunk's staging buffer ([d rows][128 positions], 16-byte pieces XOR-swizzled by the row's dim
//   quad); after the chunk's last block each dim row's 128 bytes go out as one full line (16-byte
//   stores, 8 lanes a line), zeros where no block lies (a document's 32-token tail, the layout's
//   last 64 positions); d = 64: warps 0-1 transpose (g < 16). Session 15: 0.67 -> 0.50 ms for
//   Q/K/V at d = 128 (the per-block copy wrote one 32-byte sector per L2 write request).
// Arithmetic per element is exactly the contract (src/quant.rs, src/hadamard.rs); D keeps the
// summation order of the previous kernel (per-lane FMA chains over 4 elements, then a
// pairwise tree over the d / 4 four-element groups, high index bits first: delta_dot).
// Defines: MODE (0 = 32-token blocks, 1 = per token, 2 = tensor-wide floor, the leaky control;
// its amax comes from quant_amax), DELTA (0/1, one input only), HEAD_DIM.
// quant_amax: tensor-wide amax (after the rotation) of every input, for MODE 2.
// quant_nvfp4 (HEAD_DIM 128 only; the host refuses other head dims): NVFP4 (E2M1 codes, E4M3
// group scales per 16 dims, per-token exponent) plus the exact value e2m1 * scale in BF16 for
// the emulated NVFP4 score product (input 0 only).
// The bit-level contract is src/quant.rs; GPU tests compare every byte.
#include "formats.cuh"
#include "sched.cuh"  // sched_done (QUANT_DYN)

#ifndef MODE
#define MODE 0
#endif
#ifndef DELTA
#define DELTA 0
#endif
// QUANT_ASYNC 1: the next item's rows go to shared memory by cp.async (no prefetch registers,
// so more CTAs fit) instead of registers; an A/B variant, off by default.
#ifndef QUANT_ASYNC
#define QUANT_ASYNC 0
#endif
// Resident CTAs per SM the launch bounds ask for (the host sizes the persistent grid from the
// driver's occupancy of the loaded kernel, so a variant may change this alone).
#ifndef QUANT_CTAS_PER_SM
#if DELTA
#define QUANT_CTAS_PER_SM 5
#elif QUANT_ASYNC
#define QUANT_CTAS_PER_SM 8
#else
#define QUANT_CTAS_PER_SM 7
#endif
#endif
// Knock-outs (timing only, wrong results; bench/device_s13.sh PHASE=c): QUANT_PROF_NODIM skips the
// dim-major copy (its shared-memory transpose and stores), QUANT_PROF_NOTOK the token-major code
// stores, QUANT_PROF_NOHAD the rotation's arithmetic, QUANT_PROF_NOBAR the block-amax barrier
// (each warp its own maximum): what each costs of the kernel's time. (Session 14's knock-outs of
// the copy's parts and layouts, TILED, NODIMST, NODIMBAR, CONTIG, DIM16, were removed after
// their measurement: docs/perf.md "Session 14"; commit 5fe13cf has them.)
// QUANT_PERM_MASK: bit i set = input i's dim-major copy has its tokens permuted within each
// 32-token block (dim_token; QuantInput::dim_perm: Q and dO for the v4 backward, BWD_QPERM).
// A define, so a build without permuted inputs (K and V; MODE 1/2 paths) is the plain transposes' code.
#ifndef QUANT_PERM_MASK
#define QUANT_PERM_MASK 0
#endif
// QUANT_ILEAVE_MASK: bit i set = input i's dim-major copy has the tokens of each 16-token group
// interleaved, position 2i token i and 2i + 1 token i + 8 (ileave_token; QuantInput::dim_order
// DimOrder::KeyIleave: K for the v4 backward with BWD_DS_STSM, whose dQ products read their
// dS tile in that key order). Disjoint from QUANT_PERM_MASK.
#ifndef QUANT_ILEAVE_MASK
#define QUANT_ILEAVE_MASK 0
#endif
// Shared-memory layouts without bank conflicts (session 17, "SWZ"; the dO quantiser's ncu had
// counted 2 wavefronts per access where 1 would do on two accesses): the code tile's swizzle
// (tile_word / swz_row) takes row bit 4 into its bit 3, so the permuted inputs' (QUANT_PERM_MASK)
// column reads under dim_token reach 4 distinct bank groups; the chunk buffer's piece swizzle
// (dimbuf_off) is a rotation of the dim quad's low three bits, so a half warp's 8-byte transpose
// writes land on all 32 banks. Every access then takes one wavefront per 128 bytes (checked for
// all accesses at d = 128 and 64 by simulating the banks), and the kernel forms each address as
// (per-thread part ^ constant) + constant. Measured (session 17, same call, two rounds): Q/K/V
// quantiser -1.1..-2.5% (0.505-0.519 -> 0.499-0.503 ms), dO quantiser 0.252 / 0.254 -> 0.249 /
// 0.249 ms; bitwise the same bytes (gpu_quant). Measured in the same call and not kept: the plan
// lookups one item ahead (QUANT_AHEAD: -1.1 / -0.2 / +1.4%) and the block amax by redux.sync
// (with both: no better than SWZ alone).
// QUANT_DYN 1 (session 32; the Q/K/V launch's default at head dim 128 since session 33, host knob
// FLAMIA_QUANT_DYN):
// a CTA takes its chunk items after the first from a global counter (p.counter, reset by the
// last CTA: sched_done) instead of a fixed grid-stride share. Why: the share is fixed, so a CTA
// that starts late (launched into the previous kernel's tail, as under the PDL chain, which
// measured the training call 2-3% slower at the short workloads in session 32) ends late; and at
// short documents the Q items cost ~1.3x the K and V ones (Q's two copies against one each), while
// the grid's stride (924 CTAs = 19.25 x 48 head slots) gives a third of the CTAs two Q items in
// every four and the rest one: with 27 or 26 items a CTA, the longest share is ~7% over the mean
// at 64x1024 (a model of the shares; claimed in list order, ~2.6%). Thread 0
// claims the next chunk item when the cursor takes the last claim, publishes it through shared
// memory before the item's last barrier (two slots: MODE 1 / 2 have no block-amax barrier
// between one item's read and the next item's write), and every thread reads it after that
// barrier. The same bytes (items are independent; only their CTA changes).
// Measured (session 33, same call, two rounds, d = 128): quantiser -3.6..-4.6% on all nine
// workloads, 1x65536 included (0.504 -> 0.481 ms, 3.20 -> 3.35-3.39 TB/s), the training call
// within noise; d = 64 +0.5..+2.1% (its items are half as long, so the claim's round trip weighs
// more) and the dO launch (DELTA) +1.6..+3.7% (5 CTAs per SM; 4 bytes of spills with the claims):
// off there.
#ifndef QUANT_DYN
#define QUANT_DYN 0
#endif
#if QUANT_DYN && (defined(QUANT_PROF_NODIM) || QUANT_ASYNC)
#error "QUANT_DYN: not with QUANT_PROF_NODIM or QUANT_ASYNC (their loop ends have no claim publication)"
#endif
// QUANT_STCS 1 (the host's default; FLAMIA_QUANT_STCS=0 for A/B): the code stores as streaming
// stores (st.global.cs, evict-first): the codes of a 65,536-token call (805 MB at d = 128 and 16
// heads) do not stay in L2 for the attention kernels anyway. Measured (session 21, H200, same
// call, two rounds): Q/K/V quantiser -0.8..-0.9%, dO's -1.3%; the training call within noise.
#ifndef QUANT_STCS
#define QUANT_STCS 0
#endif
template <class V>
__device__ __forceinline__ void st_codes(V* p, V v) {
#if QUANT_STCS
  __stcs(p, v);
#else
  *p = v;
#endif
}
#define QUANT_INPUTS 3
// 32-element chunks of a row per thread (element i = 32 k + 8 q + j, k < NK).
#define NK (HEAD_DIM / 32)

// One input tensor and its operand.
struct QuantTensor {
  const u16* x;  // BF16 [T, heads, d]
  u8* tok;       // [T, heads, d], or null: no token-major copy (V under the v4 backward's BWD_VT_XPOSE)
  u8* dim;       // [heads, d, Tpad], or null: no dim-major copy (K or Q under the session 22 knobs)
  i8* exps;      // [T, heads]
  int heads;
  int hadamard;
};

struct QuantParams {
  QuantTensor in[QUANT_INPUTS];  // inputs 0 .. ninputs-1
  const int* blocks;             // int4 per 32-token block: doc start, doc length, padded doc start, block offset in doc
  const int* chunks;             // int4 per 128-position chunk: the blocks at its 4 slots (-1: none)
  const u16* o;                  // DELTA: forward output O, BF16 [T, H, d] (input 0's shape)
  float* delta;                  // DELTA: [T, H]
  u32* amax;                     // MODE 2 / quant_amax: one float (as bits) per input, maxed atomically
  u8* fp4_codes;                 // [T, H, d] (low nibble)
  u8* fp4_scales;                // [T, H, d / 16]
  u16* fp4_vals;                 // [T, H, d] BF16 e2m1 * scale
  int T, Tpad;
  int nblocks;                   // blocks of the plan
  int ninputs;                   // 1 .. QUANT_INPUTS
  int slots;                     // heads of all inputs together
  int nchunks;                   // Tpad / 128
  int* counter;                  // QUANT_DYN: [2], the chunk items' claim counter (sched_done resets it)
};

// Field-wise select (a dynamic index into the parameter struct would copy it to local memory).
__device__ __forceinline__ QuantTensor pick_input(const QuantParams& p, int ti) {
  QuantTensor t;
  t.x = ti == 0 ? p.in[0].x : ti == 1 ? p.in[1].x : p.in[2].x;
  t.tok = ti == 0 ? p.in[0].tok : ti == 1 ? p.in[1].tok : p.in[2].tok;
  t.dim = ti == 0 ? p.in[0].dim : ti == 1 ? p.in[1].dim : p.in[2].dim;
  t.exps = ti == 0 ? p.in[0].exps : ti == 1 ? p.in[1].exps : p.in[2].exps;
  t.heads = ti == 0 ? p.in[0].heads : ti == 1 ? p.in[1].heads : p.in[2].heads;
  t.hadamard = ti == 0 ? p.in[0].hadamard : ti == 1 ? p.in[1].hadamard : p.in[2].hadamard;
  return t;
}

// One work item: a 32-token block (its plan entry), an input and a head of it.
struct Item {
  int doc0, L, pad0, b0;  // the plan's block entry
  int ti, h;
};

__device__ __forceinline__ int4 load_block(const QuantParams& p, int b) {
  return __ldg(reinterpret_cast<const int4*>(p.blocks) + b);
}

// The item of plan block entry `blk` and head slot `s`.
__device__ __forceinline__ Item make_item(const QuantParams& p, int4 blk, int s) {
  Item it;
  it.doc0 = blk.x;
  it.L = blk.y;
  it.pad0 = blk.z;
  it.b0 = blk.w;
  it.ti = 0;
  if (s >= p.in[0].heads) {
    s -= p.in[0].heads;
    it.ti = 1;
    if (s >= p.in[1].heads) {
      s -= p.in[1].heads;
      it.ti = 2;
    }
  }
  it.h = s;
  return it;
}

// Steps item (block b, head slot s) by gb * slots + gs items (the grid size), s < slots.
__device__ __forceinline__ void advance(int& b, int& s, int gb, int gs, int slots) {
  s += gs;
  b += gb;
  if (s >= slots) {
    s -= slots;
    ++b;
  }
}

// The thread's 8 NK BF16 elements of row tt of the item (tokens past the document are loaded
// from the block's first row and zeroed by the caller), as NK 16-byte streaming loads.
__device__ __forceinline__ void load_rows(const u16* base, const Item& it, int heads, uint4 (&raw)[NK]) {
  const int tt = threadIdx.x >> 2, q = threadIdx.x & 3;
  const int n = min(32, it.L - it.b0);
  const long long tok = it.doc0 + it.b0 + (tt < n ? tt : 0);
  const uint4* src = reinterpret_cast<const uint4*>(base + (tok * heads + it.h) * HEAD_DIM + 8 * q);
#pragma unroll
  for (int k = 0; k < NK; ++k) raw[k] = __ldcs(src + 4 * k);
}

// Rows past the document hold another row's values: their amax is masked and their codes zeroed.
#if QUANT_ASYNC
// load_rows into the thread's own shared-memory slots st[k][tid] by cp.async (one group).
__device__ __forceinline__ void stage_rows(const u16* base, const Item& it, int heads, uint4 (*st)[128]) {
  const int tt = threadIdx.x >> 2, q = threadIdx.x & 3;
  const int n = min(32, it.L - it.b0);
  const long long tok = it.doc0 + it.b0 + (tt < n ? tt : 0);
  const uint4* src = reinterpret_cast<const uint4*>(base + (tok * heads + it.h) * HEAD_DIM + 8 * q);
#pragma unroll
  for (int k = 0; k < NK; ++k)
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_u32(&st[k][threadIdx.x])), "l"(src + 4 * k)
                 : "memory");
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
#endif

__device__ __forceinline__ void unpack_bf16(const uint4 (&raw)[NK], float (&v)[8 * NK]) {
#pragma unroll
  for (int k = 0; k < NK; ++k) {
    const u32 w[4] = {raw[k].x, raw[k].y, raw[k].z, raw[k].w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      v[8 * k + 2 * j] = __uint_as_float(w[j] << 16);
      v[8 * k + 2 * j + 1] = __uint_as_float(w[j] & 0xffff0000u);
    }
  }
}

// In-register butterfly stage over v-index bit M (v[i] holds element 32 (i >> 3) + 8 q + (i & 7)).
template <int M>
__device__ __forceinline__ void butterfly_local(float (&v)[8 * NK]) {
#pragma unroll
  for (int i = 0; i < 8 * NK; ++i)
    if (!(i & M)) {
      const float a = v[i], b = v[i | M];
      v[i] = __fadd_rn(a, b);
      v[i | M] = __fsub_rn(a, b);
    }
}

// Butterfly stage across the lanes of a row (lane bit M = q bit): the lower lane keeps a + b, the
// upper a - b, as fma(own, +-1, other): the product is exact, so this is the one rounding of the
// addition (signed zeros included), one instruction instead of two predicated adds.
template <int M>
__device__ __forceinline__ void butterfly_lanes(float (&v)[8 * NK]) {
  const float sign = (threadIdx.x & M) ? -1.f : 1.f;
#pragma unroll
  for (int i = 0; i < 8 * NK; ++i) {
    const float o = __shfl_xor_sync(0xffffffffu, v[i], M);
    v[i] = __fmaf_rn(v[i], sign, o);
  }
}

// The Hadamard-d normalisation (src/hadamard.rs norm_factor): 1/8 at d = 64, RN(1/sqrt(128))
// at d = 128.
#if HEAD_DIM == 128
#define HADAMARD_NORM __uint_as_float(0x3DB504F3u)
#else
#define HADAMARD_NORM __uint_as_float(0x3E000000u)
#endif

__device__ __forceinline__ void scale_rows(float (&v)[8 * NK], float c) {
#pragma unroll
  for (int i = 0; i < 8 * NK; ++i) v[i] = __fmul_rn(v[i], c);
}

// The Hadamard-d of the row (contract: stages h = 1, 2, ..., d / 2 in order, no FMA, then one
// multiply by HADAMARD_NORM, which quant_e4m3 folds into its quantisation scale where exact).
template <bool NORMALISE>
__device__ __forceinline__ void hadamard_rows(float (&v)[8 * NK]) {
  butterfly_local<1>(v);  // h = 1
  butterfly_local<2>(v);  // h = 2
  butterfly_local<4>(v);  // h = 4
  butterfly_lanes<1>(v);  // h = 8
  butterfly_lanes<2>(v);  // h = 16
  butterfly_local<8>(v);  // h = 32
#if HEAD_DIM == 128
  butterfly_local<16>(v);  // h = 64
#endif
  if (NORMALISE) scale_rows(v, HADAMARD_NORM);
}

// max |v| in four interleaved chains (a quarter of the serial chain's latency); exact, so the
// order is free.
__device__ __forceinline__ float absmax_rows(const float (&v)[8 * NK]) {
  float m[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
  for (int i = 0; i < 8 * NK; ++i) m[i & 3] = fmaxf(m[i & 3], fabsf(v[i]));
  return fmaxf(fmaxf(m[0], m[1]), fmaxf(m[2], m[3]));
}

// Word index in the shared code tile (32 rows x 32 words) of word w of row r: XOR swizzle that
// keeps both the row writes (8 rows x 4 quarters per warp) and the column reads (8 dim quads x
// 4 token octets per warp) on 32 distinct banks. d = 64 uses words w < 16 of every row (the
// swizzle spreads them over all 32 words; both accesses stay on 32 distinct banks per warp).
// The swizzle of row r: bit 3 also takes row bit 4, so the permuted column reads (dim_token: row
// bits 2 and 4 vary over the token octets) reach 4 distinct bank groups too. Linear in r's bits
// (XORs only), so the kernel forms every access's word as (per-thread part ^ constant) + constant.
__device__ __forceinline__ int swz_row(int r) {
  return (r & 1) | ((((r >> 1) & 3) ^ ((r >> 3) & 3) ^ ((r >> 4) & 1)) << 3);
}

__device__ __forceinline__ int tile_word(int r, int w) {
  return r * 32 + (w ^ swz_row(r));
}

#if DELTA
// D = sum_i decode(code_i) * o_i in the previous kernel's order: element groups g = i / 4 (d / 4
// of them) hold an FMA chain each (j = 0..3 in order, from 0); the group sums are added
// pairwise, pairing on g's highest bit first, bit 0 last (g = 8 k + 2 q + j / 4: k's bits in
// registers, bits 2, 1 across the row's lanes, bit 0 last). d = 128: 32 groups, bits 4, 3, 2,
// 1, 0; d = 64: 16 groups, bits 3, 2, 1, 0.
__device__ __forceinline__ float delta_dot(const u32 (&codes)[2 * NK], const uint4 (&oraw)[NK]) {
  float s[NK][2];
#pragma unroll
  for (int k = 0; k < NK; ++k) {
    const u32 ow[4] = {oraw[k].x, oraw[k].y, oraw[k].z, oraw[k].w};
#pragma unroll
    for (int jh = 0; jh < 2; ++jh) {
      const u32 c = codes[2 * k + jh];
      float acc = 0.f;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const u32 w = ow[2 * jh + (j >> 1)];
        const float o = __uint_as_float((j & 1) ? (w & 0xffff0000u) : (w << 16));
        acc = __fmaf_rn(e4m3_decode((c >> (8 * j)) & 0xffu), o, acc);
      }
      s[k][jh] = acc;
    }
  }
  float d[2];
#pragma unroll
  for (int jh = 0; jh < 2; ++jh) {
#if HEAD_DIM == 128
    const float a0 = __fadd_rn(s[0][jh], s[2][jh]), a1 = __fadd_rn(s[1][jh], s[3][jh]);
    float b = __fadd_rn(a0, a1);
#else
    float b = __fadd_rn(s[0][jh], s[1][jh]);
#endif
    b = __fadd_rn(b, __shfl_xor_sync(0xffffffffu, b, 2));
    d[jh] = __fadd_rn(b, __shfl_xor_sync(0xffffffffu, b, 1));
  }
  return __fadd_rn(d[0], d[1]);
}
#endif

// The token of a 32-token block at position k of a permuted dim-major copy (QUANT_PERM_MASK, e.g.
// the v4 backward's Q and dO with BWD_QPERM): sigma(k) = 16 (k >> 4) + 8 ((k & 3) >> 1) + 2 ((k >> 2) & 3)
// + (k & 1), the score column that lane q's E4M3 pairs of an m64nN accumulator put at A-fragment
// index k when they are packed without shuffles (attn_common.cuh codes_to_afrag_perm). For k = 8s + r
// (thread octet s, unrolled r).
// Its two parts have disjoint bits: the octet's (dim_token_s) and the unrolled index's
// (dim_token_r), so the kernel forms tile addresses from each separately.
__device__ __forceinline__ int dim_token_s(int s) { return 16 * (s >> 1) + 4 * (s & 1); }
__device__ __forceinline__ int dim_token_r(int r) { return 8 * ((r & 3) >> 1) + 2 * (r >> 2) + (r & 1); }
__device__ __forceinline__ int dim_token(int s, int r) { return dim_token_s(s) + dim_token_r(r); }
// The interleaved order (QUANT_ILEAVE_MASK): position k of a 16-token group holds token
// (k >> 1) + 8 (k & 1); for k = 8s + r that is dim_token_s(s) + ileave_token_r(r), the same
// octet part as dim_token's (so the same bank pattern: the r part sets rows bits 0, 1 and 3).
__device__ __forceinline__ int ileave_token_r(int r) { return (r >> 1) + 8 * (r & 1); }

// Where the next block lies in the chunk items: chunk c, head slot s, slot j of the chunk, and
// the chunk's four block indices cb (plan entries; -1: no block at that slot).
struct Cursor {
  int c, s, j;
  int4 cb;
};

__device__ __forceinline__ int chunk_block(const int4& cb, int j) {
  return j == 0 ? cb.x : j == 1 ? cb.y : j == 2 ? cb.z : cb.w;
}

__device__ __forceinline__ int4 load_chunk(const QuantParams& p, int c) {
  return __ldg(reinterpret_cast<const int4*>(p.chunks) + c);
}

// The chunk's next slot after the cursor's holding a block; 4: none.
__device__ __forceinline__ int next_slot(const Cursor& u) {
  int j = u.j + 1;
  while (j < 4 && chunk_block(u.cb, j) < 0) ++j;
  return j;
}

// Steps to the next block: the chunk's next slot holding one, else slot 0 of the next item
// (every chunk's slot 0 holds a block: a chunk starts a 64-position segment of a document;
// the host checks it).
__device__ __forceinline__ void cursor_next(const QuantParams& p, Cursor& u, int gb, int gs) {
  const int j = next_slot(u);
  if (j < 4) {
    u.j = j;
    return;
  }
  advance(u.c, u.s, gb, gs, p.slots);
  u.j = 0;
  if (u.c < p.nchunks) u.cb = load_chunk(p, u.c);
}

// QUANT_DYN: as cursor_next, the next chunk item being `nxt` (c * slots + s, claimed); true when
// the cursor took it and it is an item (then the CTA claims the one after).
__device__ __forceinline__ bool cursor_next_dyn(const QuantParams& p, Cursor& u, int nxt) {
  const int j = next_slot(u);
  if (j < 4) {
    u.j = j;
    return false;
  }
  u.c = nxt / p.slots;
  u.s = nxt - u.c * p.slots;
  u.j = 0;
  if (u.c >= p.nchunks) return false;
  u.cb = load_chunk(p, u.c);
  return true;
}

// Byte offset in the chunk's dim-major staging buffer ([HEAD_DIM rows][128 positions]) of the
// 16-byte piece k (positions 16k .. 16k+15) of row r: pieces XOR-swizzled by the row's dim quad.
// The piece swizzle of dim quad g, rotated, (g & 3) << 1 | (g >> 2) & 1: the 4 quads of a half
// warp's 8-byte writes (pieces 2j, 2j + 1) land on 8 distinct pieces (all 32 banks).
__device__ __forceinline__ int dimbuf_rot(int g) { return ((g & 3) << 1) | ((g >> 2) & 1); }
__device__ __forceinline__ int dimbuf_off(int r, int k) { return r * 128 + 16 * (k ^ dimbuf_rot(r >> 2)); }

// dimbuf_off(16 i + tid / 8, tid % 8) (the flush's pass i) from fb = its pass-0 offset: the dim
// quad g = 4 i + tid / 32 changes the piece swizzle by bit 0 on odd passes.
__device__ __forceinline__ int flush_off(int fb, int i) {
  return (fb ^ (16 * (i & 1))) + 2048 * i;
}

extern "C" __global__ void __launch_bounds__(128, QUANT_CTAS_PER_SM) quant_e4m3(const QuantParams p) {
  __shared__ __align__(16) u32 tile[2][32 * 32];
#if MODE == 0 && !defined(QUANT_PROF_NOBAR)
  __shared__ float wmax[2][4];
  const int w = threadIdx.x >> 5;
#endif
  const int tid = threadIdx.x, tt = tid >> 2, q = tid & 3;
  // items (chunk c, head slot s) = c * slots + s; nu: the next block, cu: this one
  const int slots = p.slots;
#if !QUANT_DYN
  // taken grid-stride: (c, s) advances by the grid size without a division per item
  const int gb = gridDim.x / slots, gs = gridDim.x - gb * slots;
#endif
  __shared__ __align__(16) u8 dimbuf[HEAD_DIM * 128];
  pdl_wait();  // (chained launch: the inputs' producers, the previous call's readers of the codes)
  pdl_trigger();
  Cursor nu{(int)blockIdx.x / slots, (int)blockIdx.x % slots, 0, make_int4(0, 0, 0, 0)};
#if QUANT_DYN
  // the claim slots (two: see QUANT_DYN), the parity of the next publication and whether a claim
  // is in flight, thread 0's claim, the next chunk item (every thread)
  __shared__ int claim_s[2];
  int cst = 0, claim = 0, nxt;  // cst: bit 0 the parity, bit 1 a claim in flight (one register)
  if (nu.c >= p.nchunks) {
    if (tid == 0) sched_done(p.counter);
    return;
  }
  if (tid == 0) claim = (int)gridDim.x + atomicAdd(p.counter, 1);
#else
  if (nu.c >= p.nchunks) return;
#endif
  nu.cb = load_chunk(p, nu.c);
  int cc = nu.c, cj = 0;  // this block's chunk and slot
  Item it = make_item(p, load_block(p, nu.cb.x), nu.s);
#if QUANT_ASYNC
  __shared__ __align__(16) uint4 stage[2][NK][128];
  {
    const QuantTensor t0 = pick_input(p, it.ti);
    stage_rows(t0.x, it, t0.heads, stage[0]);
  }
#else
  uint4 raw[NK];
  {
    const QuantTensor t0 = pick_input(p, it.ti);
    load_rows(t0.x, it, t0.heads, raw);
  }
#endif
#if QUANT_DYN
  // the first claim, published at once (its latency overlaps the first rows' loads); the cursor
  // may take it here already (a one-block chunk), then the next claim is published at once too,
  // so the loop's first item may take that one (every item reads its own publication)
  if (tid == 0) claim_s[0] = claim;
  __syncthreads();
  nxt = claim_s[0];
  cst = 1;  // (slot 0 may still be read: the loop's first publication goes to slot 1)
  if (cursor_next_dyn(p, nu, nxt)) {
    if (tid == 0) claim_s[1] = (int)gridDim.x + atomicAdd(p.counter, 1);
    __syncthreads();
    nxt = claim_s[1];
    cst = 0;  // (every thread has read slot 0 before this barrier)
  }
#else
  cursor_next(p, nu, gb, gs);
#endif
  for (int buf = 0;; buf ^= 1) {
    const QuantTensor t = pick_input(p, it.ti);
    const int n = min(32, it.L - it.b0);
    float v[8 * NK];
#if !QUANT_ASYNC
    unpack_bf16(raw, v);
#endif
    // the next item's rows are in flight while this one is computed
    const bool has_next = nu.c < p.nchunks;
    const bool flush = !has_next || nu.j == 0;  // this block is its chunk item's last
    const int ncc = nu.c, ncj = nu.j;
    Item nx = it;
    if (has_next) {
      nx = make_item(p, load_block(p, chunk_block(nu.cb, nu.j)), nu.s);
      const QuantTensor tn = pick_input(p, nx.ti);
#if QUANT_ASYNC
      stage_rows(tn.x, nx, tn.heads, stage[buf ^ 1]);
#else
      load_rows(tn.x, nx, tn.heads, raw);
#endif
#if QUANT_DYN
      if (cursor_next_dyn(p, nu, nxt)) {  // (uniform) took the claim: the next one goes out now
        if (tid == 0) claim = (int)gridDim.x + atomicAdd(p.counter, 1);
        cst |= 2;
      }
#else
      cursor_next(p, nu, gb, gs);
#endif
    }
#if QUANT_ASYNC
    // this item's copies (this thread's own slots) have landed; the next item's may still fly
    if (has_next) {
      asm volatile("cp.async.wait_group 1;\n" ::: "memory");
    } else {
      asm volatile("cp.async.wait_group 0;\n" ::: "memory");
    }
    {
      uint4 raw[NK];
#pragma unroll
      for (int k = 0; k < NK; ++k) raw[k] = stage[buf][k][tid];
      unpack_bf16(raw, v);
    }
#endif
    // The rotation's normalisation c is folded into the quantisation scale: max_i RN(h_i c) =
    // RN(max_i |h_i| c) (rounding is monotonic), and RN(h c 2^-e) = RN(h c) 2^-e whenever the
    // code can be non-zero, unless e <= -116 (RN(h c) may then be an f32 subnormal while
    // h c 2^-e >= 2^-10); such warps multiply by c first, as the contract says. (At d = 64,
    // c = 1/8 makes h c exact except in that same subnormal range, so the case stays.)
    const float cn = t.hadamard ? HADAMARD_NORM : 1.f;
#ifndef QUANT_PROF_NOHAD
    if (t.hadamard) hadamard_rows<false>(v);
#endif
    float m = tt < n ? __fmul_rn(absmax_rows(v), cn) : 0.f;
#if MODE == 1
    const int e = block_exponent_nn(quad_max(m));  // (m >= +0, never NaN: absmax_rows)
#elif MODE == 2
    const int e = floor_exponent(__uint_as_float(p.amax[it.ti]));
#else
    m = warp_max(m);
#ifdef QUANT_PROF_NOBAR
    const int e = block_exponent_nn(m);
#else
    if ((tid & 31) == 0) wmax[buf][w] = m;
    __syncthreads();
    const int e = block_exponent_nn(fmaxf(fmaxf(wmax[buf][0], wmax[buf][1]), fmaxf(wmax[buf][2], wmax[buf][3])));
#endif
#endif
#if DELTA
    // O of this item (not prefetched: registers), for D after the codes
    uint4 ocur[NK];
    load_rows(p.o, it, p.in[0].heads, ocur);
#endif
    float f = pow2f(-e);
    if (t.hadamard) {
      if (__all_sync(0xffffffffu, e > -116)) {
        f = __fmul_rn(HADAMARD_NORM, f);  // exact: a normal number times a power of two
      } else {
        scale_rows(v, HADAMARD_NORM);
      }
    }
    u32 codes[2 * NK];
#pragma unroll
    for (int c = 0; c < 2 * NK; ++c)
      codes[c] = tt < n ? e4m3x4(v[4 * c] * f, v[4 * c + 1] * f, v[4 * c + 2] * f, v[4 * c + 3] * f) : 0u;
    u32* tl = tile[buf];
    const bool dim = t.dim != nullptr;  // (CTA-uniform: an item is one input's)
    if (dim) {
      // tile_word(tt, 8 k + 2 q + o) = wb ^ (8 k + o)
      const int wb = tile_word(tt, 2 * q);
#pragma unroll
      for (int k = 0; k < NK; ++k) {
        tl[wb ^ (8 * k)] = codes[2 * k];
        tl[wb ^ (8 * k + 1)] = codes[2 * k + 1];
      }
    }
#if DELTA
    const float dsum = delta_dot(codes, ocur);  // every lane: the shuffles need the whole warp
#endif
    if (tt < n) {
      const long long row = (long long)(it.doc0 + it.b0 + tt) * t.heads + it.h;
      uint2* dst = reinterpret_cast<uint2*>(t.tok + row * HEAD_DIM + 8 * q);
#ifdef QUANT_PROF_NOTOK
      if (codes[0] == 0x12345678u)  // (keeps the codes alive; practically never true)
#else
      // (a null `tok`: no token-major copy of this input, V under BWD_VT_XPOSE; CTA-uniform)
      if (t.tok != nullptr)
#endif
#pragma unroll
      for (int k = 0; k < NK; ++k) st_codes(dst + 4 * k, make_uint2(codes[2 * k], codes[2 * k + 1]));
      if (q == 0) t.exps[row] = (i8)e;
#if DELTA
      // value = decode * 2^e: apply the exponent once to the sum (exact power of two)
      if (q == 0) p.delta[row] = e >= -126 ? dsum * pow2f(e) : (dsum * 0.5f) * pow2f(e + 1);
#endif
    }
#ifdef QUANT_PROF_NODIM
    if (!has_next) break;
    it = nx;
    continue;
#endif
#if QUANT_DYN
    if ((cst & 2) && tid == 0) claim_s[cst & 1] = claim;  // (read by every thread after the next barrier)
#define QUANT_DYN_READ()      \
  if (cst & 2) {              \
    nxt = claim_s[cst & 1];   \
    cst = (cst & 1) ^ 1;      \
  }
#else
#define QUANT_DYN_READ()
#endif
    if (!dim) {
      // no dim-major copy of this input (a null `dim`: K or Q under FLAMIA_BWD_KD_XPOSE /
      // FLAMIA_FWD_QD); the barrier the copy has, so tile[buf] is never rewritten two items on
      // while a slow warp still reads it. (This tail repeats the loop's end on purpose: folding
      // the copy into an `if (dim)` before one shared tail made ptxas spill 48 B at d = 128.)
      __syncthreads();
      QUANT_DYN_READ();
      cc = ncc;
      cj = ncj;
      if (!has_next) break;
      it = nx;
      continue;
    }
    __syncthreads();
    QUANT_DYN_READ();
    // dim-major copy: thread (dim quad g, token octet s) transposes 8 tokens x 4 dims and writes
    // 8 bytes per dim row; lanes s = 0..3 fill one 32-byte sector. g < d / 4: at d = 64 warps 2
    // and 3 skip it (a warp-uniform branch).
#if HEAD_DIM < 128
    if ((tid >> 2) < HEAD_DIM / 4)
#endif
    {
      const int s = tid & 3, g = tid >> 2;
      u32 wd[8];
      // tile_word(row, g) with row = (thread part) + (part of r), disjoint bits:
      // tile_word(row_s, g) ^ swz_row(row_r), plus 32 row_r
      if ((QUANT_PERM_MASK >> it.ti) & 1) {
        const int pb = tile_word(dim_token_s(s), g);
#pragma unroll
        for (int r = 0; r < 8; ++r) {
          const int rr = dim_token_r(r);
          wd[r] = tl[(pb ^ swz_row(rr)) + 32 * rr];
        }
      } else if ((QUANT_ILEAVE_MASK >> it.ti) & 1) {
        const int pb = tile_word(dim_token_s(s), g);
#pragma unroll
        for (int r = 0; r < 8; ++r) {
          const int rr = ileave_token_r(r);
          wd[r] = tl[(pb ^ swz_row(rr)) + 32 * rr];
        }
      } else {
        const int rb = tile_word(8 * s, g);
#pragma unroll
        for (int r = 0; r < 8; ++r) wd[r] = tl[(rb ^ swz_row(r)) + 32 * r];
      }
      u32 lo[4], hi[4];
#pragma unroll
      for (int half = 0; half < 2; ++half) transpose_bytes_4x4(wd + 4 * half, half ? hi : lo);
      // into the chunk's staging buffer: row 4g + c, positions 32j + 8s .. +7
      // dimbuf_off(4 g + c, 2 cj + (s >> 1)) + 8 (s & 1) = (db ^ 32 cj) + 128 c
      const int db = (512 * g + 16 * ((s >> 1) ^ dimbuf_rot(g)) + 8 * (s & 1)) ^ (32 * cj);
#pragma unroll
      for (int c = 0; c < 4; ++c) *reinterpret_cast<uint2*>(dimbuf + db + 128 * c) = make_uint2(lo[c], hi[c]);
    }
    if (flush) {
      // every block of the chunk item is in the buffer: each row's 128 positions as one line
      // (lanes 8i .. 8i+7 of a warp: one row), zeros at the slots without a block
      // (pass i: rows 16 i + tid / 8, piece k = tid % 8; the row's line starts at dst, 16 rows on
      // per pass; a full chunk, every slot holding a block, is the CTA-uniform usual case and
      // takes no selects)
      const int4 cb = load_chunk(p, cc);
      const int k = tid & 7, fb = dimbuf_off(tid >> 3, k);
      const long long rstep = 16LL * p.Tpad;
      u8* dst = t.dim + ((long long)it.h * HEAD_DIM + (tid >> 3)) * p.Tpad + 128LL * cc + 16 * k;
      __syncthreads();
      if ((cb.y | cb.z | cb.w) >= 0) {  // (slot 0 always holds a block)
#pragma unroll
        for (int i = 0; i < HEAD_DIM * 8 / 128; ++i, dst += rstep)
          st_codes(reinterpret_cast<uint4*>(dst), *reinterpret_cast<const uint4*>(dimbuf + flush_off(fb, i)));
      } else {
        const bool none = chunk_block(cb, k >> 1) < 0;
#pragma unroll
        for (int i = 0; i < HEAD_DIM * 8 / 128; ++i, dst += rstep) {
          uint4 v = *reinterpret_cast<const uint4*>(dimbuf + flush_off(fb, i));
          if (none) v = make_uint4(0u, 0u, 0u, 0u);
          st_codes(reinterpret_cast<uint4*>(dst), v);
        }
      }
    }
    cc = ncc;
    cj = ncj;
    if (!has_next) break;
    it = nx;
  }
#if QUANT_DYN
  if (tid == 0) sched_done(p.counter);  // (after thread 0's last claim)
#endif
}

#undef QUANT_DYN_READ


// Tensor-wide amax (after the rotation) of every input, for MODE 2: grid-stride over the same
// items; one atomic per warp and input at the end.
extern "C" __global__ void __launch_bounds__(128) quant_amax(const QuantParams p) {
  const int nitems = p.nblocks * p.slots;
  const int tt = threadIdx.x >> 2;
  float m[QUANT_INPUTS] = {0.f, 0.f, 0.f};
  for (int item = blockIdx.x; item < nitems; item += gridDim.x) {
    const Item it = make_item(p, load_block(p, item / p.slots), item % p.slots);
    const QuantTensor t = pick_input(p, it.ti);
    uint4 raw[NK];
    load_rows(t.x, it, t.heads, raw);
    float v[8 * NK];
    unpack_bf16(raw, v);
    if (t.hadamard) hadamard_rows<true>(v);
    const float a = tt < min(32, it.L - it.b0) ? absmax_rows(v) : 0.f;
#pragma unroll
    for (int i = 0; i < QUANT_INPUTS; ++i) m[i] = it.ti == i ? fmaxf(m[i], a) : m[i];
  }
#pragma unroll
  for (int i = 0; i < QUANT_INPUTS; ++i) {
    const float r = warp_max(m[i]);
    if ((threadIdx.x & 31) == 0 && i < p.ninputs) atomicMax(p.amax + i, __float_as_uint(r));
  }
}

#if HEAD_DIM == 128
// NVFP4 of input 0: one warp per (token, head) row; lanes 4g .. 4g+3 hold group g (16 dims).
// d = 128 only (hadamard128_contract, 4 elements per lane): not in d = 64 modules.
__device__ __forceinline__ void load_row4(const QuantTensor& t, long long tok, int h, float (&v)[4]) {
  uint2 raw = *reinterpret_cast<const uint2*>(t.x + (tok * t.heads + h) * HEAD_DIM + 4 * (threadIdx.x & 31));
  v[0] = bf16_to_f32(raw.x & 0xffff);
  v[1] = bf16_to_f32(raw.x >> 16);
  v[2] = bf16_to_f32(raw.y & 0xffff);
  v[3] = bf16_to_f32(raw.y >> 16);
  if (t.hadamard) hadamard128_contract(v);
}

__device__ __forceinline__ float absmax4(const float (&v)[4]) {
  return fmaxf(fmaxf(fabsf(v[0]), fabsf(v[1])), fmaxf(fabsf(v[2]), fabsf(v[3])));
}

extern "C" __global__ void __launch_bounds__(128) quant_nvfp4(const QuantParams p) {
  const QuantTensor& t = p.in[0];
  const long long row = (long long)blockIdx.x * 4 + (threadIdx.x >> 5);
  if (row >= (long long)p.T * t.heads) return;
  const int lane = threadIdx.x & 31;
  float v[4];
  load_row4(t, row / t.heads, (int)(row % t.heads), v);
  const int et = nvfp4_token_exponent(warp_max(absmax4(v)));
  const float inv = pow2f(-et);
  const float gm = quad_max(absmax4(v));
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
  if (lane == 0) t.exps[row] = (i8)et;
}
#endif  // HEAD_DIM == 128
