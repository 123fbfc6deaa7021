// FLAMIA attention forward v4 (Hopper, E4M3 scores: mxfp8 and leaky-fp8): warp-specialised,
// persistent, longest-first. docs/kernels.md "Forward v4" has the design and its arithmetic.
//
// CTA = 384 threads, one per SM, for the whole launch:
//   warpgroup 0, warp 0   producer: takes work items (sched.cuh), TMA-loads each item's 128-query
//                         Q tile into a QSLOTS-deep ring and every 128-key K tile and dim-major V
//                         tile into a FWD_STAGES-deep ring (token rows with the swizzle of their
//                         width, HEAD_DIM bytes; V's 128-key rows with the 128-byte swizzle), plus
//                         the keys' exponents (ordinary loads: one key per 32-key group with
//                         token-block scales, every key with per-token ones); registers cut to 56
//                         (setmaxnreg)
//   warpgroups 1, 2       consumers, rows 0..63 / 64..127 of the query tile; both read every K/V
//                         stage (half the L2 traffic per FLOP of a 64-row tile); 224 registers.
// Per key tile a consumer computes
//   S  = Q K^T                     RS wgmma m64n128k32 e4m3 x HEAD_DIM/32, Q's A fragments resident in
//                                  registers for the whole item (loaded once from the Q slot)
//   P' = softmax with folded scales (softmax.cuh: one FFMA + one ex2 per interior score)
//   PV = P' V                      RS wgmma m64n{HEAD_DIM}k32 e4m3 x 4, fresh accumulator (the FP8
//                                  accumulator truncates: never feed O back in)
//   O  = O * alpha_o + PV          one FFMA per O element
// and releases the stage. Masks run only on diagonal and document-end tiles.
// Item slots (QSLOTS deep): the Q tile, the decoded item and its rows' score factors, written by the
// producer, so a consumer's item start reads shared memory only (no dependent global loads).
// Barriers: q_full[b] and kv_full[s] (the 32 producer lanes, lane 0 with the TMA bytes), q_empty[b]
// (the 256 consumer threads), kv_empty[s] (lane 0 of the 8 consumer warps).
#include "attn_common.cuh"
#include "tma.cuh"
#include "sched.cuh"
#include "softmax.cuh"
#include "epilogue.cuh"
#include "xpose.cuh"

// FWD_CW_CONST 1: the consumer body inlined once per warpgroup (consumer_copies, tma.cuh), the
// warpgroup index a compile-time constant in each copy, so ptxas keeps the wgmma descriptors and
// the warpgroup's shared-memory offsets in uniform registers instead of building them in vector
// registers and moving them over (R2UR) every key tile: 621 -> 604 SASS per interior key tile at
// d = 128 with the full token-block producer it was measured with (kernel-regs.py --per-score;
// every R2UR gone), 621 -> 619 with the lean one (ptxas keeps 5 R2UR in the loop), no spills.
// Twice the consumer code (instruction cache). Session 13: -4..-5% at 1x65536, 4x16384 and lognormal, +2..4% where the
// items are one or two key tiles long, worse at d = 64; the host sets it at d = 128 when the
// plan's query tiles visit 16 key tiles or more on average (attention.rs fwd_cw_const).
#ifndef FWD_CW_CONST
#define FWD_CW_CONST 0
#endif
#ifndef FWD_STAGES
#define FWD_STAGES 3
#endif
// Registers per thread after setmaxnreg: 224 per consumer, 56 for the producer warpgroup (the
// measured split, both producers; the token-block one would fit 24 without spills, the per-token
// one spills there). A split over the CTA's launch allocation makes setmaxnreg.inc spin for ever
// (session 14: 240 / 32 hung).
#ifndef FWD_CONS_REGS
#define FWD_CONS_REGS 224
#endif
#ifndef FWD_PROD_REGS
#define FWD_PROD_REGS 56
#endif
// The pool setmaxnreg moves registers in is the CTA's own allocation at launch: 168 x 384.
static_assert(128 * FWD_PROD_REGS + 256 * FWD_CONS_REGS <= 168 * 384, "attn_fwd_v4: register split over the CTA's 168 x 384");
#define QT 128  // query rows of a work item (two consumer warpgroups x 64)
#define QSLOTS 3
// FWD_QD_WRITE 1 (host knob FLAMIA_FWD_QD=1 when the v4 backward follows; off by default: session
// 22 measured the quantiser -10% with it but this kernel +6..+14% on short documents): the
// forward writes Q's dim-major copy (the v4 backward's dK operand, (heads, d, Tpad) with documents
// padded to 64 positions, zeros) instead of the quantiser: every item's Q tile passes through
// shared memory here anyway, once. Warp 1 of the producer warpgroup (fwd_qd_writer) transposes
// it into a [d][64]-position staging tile pair (the 64-byte swizzle of the backward's qd map) and
// bulk-stores the one or two 64-position boxes inside the document's padded span. FWD_QD_PERM:
// positions permuted within each 32-token block as the backward's BWD_QPERM reads them
// (dim_token in quant.cu: position 4m + c holds token 16 (m >> 2) + 2 (m & 3) + {0, 1, 8, 9}[c]).
#ifndef FWD_QD_WRITE
#define FWD_QD_WRITE 0
#endif
#ifndef FWD_QD_PERM
#define FWD_QD_PERM 0
#endif
// FWD_O_TMA 1 (the host's default where the staging tiles fit: attention.rs fwd_o_tma;
// FLAMIA_FWD_O_TMA=0|1 for A/B): a consumer warpgroup whose 64 rows all lie in the document
// ends its item by writing O into its staging tiles (stmatrix) and one bulk tensor store per 64
// dims (store_o_lse_tma, epilogue.cuh), instead of 16-byte global stores from registers: the
// item's end no longer waits for its O bytes to leave the SM (~25 bytes per clock per SM to L2:
// 32 KB per 128-query item at d = 128, ~1,300 clocks), which the next item's key tiles now hide.
// Warpgroups with rows past the document keep the direct stores. Shared memory: 64 x HEAD_DIM x 2
// bytes per warpgroup.
#ifndef FWD_O_TMA
#define FWD_O_TMA 0
#endif
// FWD_HALF_TILES 1 (session 30; the host's default since session 31 for the build without the
// consumer copies: attention.rs fwd_half_tiles, FLAMIA_FWD_HALF=0|all for A/B): a masked key tile that no row of the consumer warpgroup sees past its key 63 runs
// over those 64 keys only (fwd_tile<true, 32>): causal, the first warpgroup's rows q0..q0+63 of
// a diagonal tile see keys k0..k0+63 at most, so it computed S, the softmax and PV for 64 keys
// whose P is exactly zero. That is one of the ~4.5 key tiles per item at 64x1024 and most of an
// item at 256x256: about half that warpgroup's tensor and MUFU work on it. Census: see
// docs/perf.md "Session 30". Bitwise the same outputs (fwd_tile). Measured (session 31, H200, same
// call, two rounds): forward -7% at 32x2048, -4% at 64x1024, -5% lognormal, d = 64 256x256 -2%.
#ifndef FWD_HALF_TILES
#define FWD_HALF_TILES 0
#endif

// Mirrors FwdV4Params in src/gpu/attention.rs.
struct FwdV4Params {
  TmaMap q_map;  // q_tok as (HEAD_DIM bytes, Hq, T), box (HEAD_DIM, 1, 128)
  TmaMap k_map;  // k_tok as (HEAD_DIM bytes, Hkv, T), box (HEAD_DIM, 1, 128)
  TmaMap v_map;  // v_dim as (Tpad, Hkv * HEAD_DIM), box (128 tokens, HEAD_DIM dims)
  TmaMap qd_map; // FWD_QD_WRITE: q_dim as (Tpad, Hq * HEAD_DIM), box (64 tokens, HEAD_DIM dims), 64-byte swizzle
  TmaMap o_map;  // FWD_O_TMA: O as (HEAD_DIM BF16, Hq, T), box (64, 1, 64), 128-byte swizzle
  AttnParams a;
  const int* items;  // work items, longest first: tile * hq + head
  const int* tiles;  // int4 per 128-token query tile (WorkTile)
  int* counter;      // [2], zero at the launch (sched_done leaves it so)
  int nitems;
};

// A work item as the consumers see it.
struct ItemSlot {
  int code;  // tile * hq + head, or -1: no work left
  int h;
  WorkTile tile;
  float qf[QT];  // 2^eQ * scale * log2(e) per row (0: row past the document)
#if !PER_TOKEN_COLS
  int hk;        // KV head (the token-block producer's own, read back in its key-tile loop)
#endif
};

struct FwdV4Smem {
  u8 q[QSLOTS][QT * HEAD_DIM];
#if FWD_O_TMA
  u8 os[2][HEAD_DIM / 64][64 * 128];  // [warpgroup][64 dims] O staging, 64 rows x 128 bytes, 128-byte swizzle
#endif
#if FWD_QD_WRITE
  u8 qd[2][HEAD_DIM * 64];  // Q dim-major staging, two 64-position boxes (sw64_off)
#endif
  u8 k[FWD_STAGES][KT * HEAD_DIM];
  u8 v[FWD_STAGES][HEAD_DIM * KT];
  alignas(16) float kf[FWD_STAGES][KT];  // 2^eK per key (0: no key; aligned: softmax_tile's lds_f2)
  alignas(16) int ev[FWD_STAGES][KT];  // eV per key (-1000: no key)
#if PER_TOKEN_COLS
  alignas(16) float vf[FWD_STAGES][KT];  // 2^(eV - evt + 8) per key (0: no key): the interior tiles' P fold
  int evt[FWD_STAGES];       // max eV of the tile's keys (FWD_EV_RUN: of the item's tiles so far)
#endif
  ItemSlot item[QSLOTS];
  u64 q_full[QSLOTS], q_empty[QSLOTS], kv_full[FWD_STAGES], kv_empty[FWD_STAGES];
};
#ifdef SMEM_FWD4_BUDGET
static_assert(sizeof(FwdV4Smem) + 1024 <= SMEM_FWD4_BUDGET, "attn_fwd_v4: dynamic shared memory budget too small");
#endif

// The three TMA descriptors into the cache (lane 0 of the producer, once per launch).
__device__ __forceinline__ void prefetch_maps(const FwdV4Params& P) {
  tma_prefetch(&P.q_map);
  tma_prefetch(&P.k_map);
  tma_prefetch(&P.v_map);
}

// Key tiles an item visits (causal: up to the tile's last query).
__device__ __forceinline__ int fwd_key_tiles(const WorkTile& t, int causal) {
  const int kend = causal ? min(t.len, t.q0 + QT) : t.len;
  return (kend + KT - 1) / KT;
}

// The producer warp, one per scale mode below. Latency it hides: item indices are taken from the
// counter one item ahead and the next item's code and tile are loaded while the current item's K/V
// tiles are issued, so an item start waits only for its exponents; each key tile's exponents are
// loaded into registers before the warp waits for the stage to be free, so a stage's turnaround
// (release -> refilled) is the TMA's alone.
#if !PER_TOKEN_COLS
// Token-block scales: the lean producer, which fits 24 registers without spills (it runs with
// FWD_PROD_REGS); the same loads, barriers and order as the per-token producer, less kept live.
// (It replaced a producer that, like the per-token one, loaded and wrote all 128 keys' exponents
// and kept the item in registers: 0..-12% forward on an H200, bitwise the same outputs.)
//  - The consumers read only the first key of each 32-key group (softmax.cuh: kf[32 G], ev[32 G];
//    the exponents are uniform over a group), so lanes 0..3 load key group `lane`'s exponents
//    (one key each, 0 / -1000 past the document) and write its slot (FWD_TILE_TRIM: slot
//    `lane`, the four side by side for one 16-byte load); the other 124 slots of sm.kf / sm.ev
//    are never written nor read.
//  - The key-tile loop reads the item's tile and KV head back from the item's slot (the
//    producer is its only writer, and rewrites it only QSLOTS items later) instead of keeping
//    them in registers.
//  - One register `u` holds the next item decoded, spread over lanes (0..3: its WorkTile, one
//    component per lane, loaded after the first key tile's TMA; 5: its head; 6: its KV head;
//    broadcast by shuffles when the item starts) and, on lane 4, the index of the item after it
//    (the counter's atomicAdd, one item ahead).
//  - Both ring positions are in one register: bits 0..7 count Q slots modulo 2 QSLOTS, bits
//    8..15 K/V stages modulo 2 FWD_STAGES (slot = n % depth, phase = n >= depth).
// FWD_L2_PROBE (timing only, wrong results: bench/device_s36.sh): the lean producer TMA-loads
// only some key tiles' K and V (1: the even ones; 2: the first FWD_STAGES of each item) and
// arrives on the other stages without bytes, so the consumers compute on stale stage contents.
// Same instructions and products, half (or almost none) of the L2 -> SM bytes: what the K/V
// traffic costs the forward at the power cap's clock. Session 35: 0..-2% at 1x65536, 4x16384
// and 16x4096 (the clock after the loop +3..+5%), so sharing K/V between CTAs would not pay.
#ifndef FWD_L2_PROBE
#define FWD_L2_PROBE 0
#endif
__device__ __forceinline__ bool fwd_l2_probe_skip(int kt) {
  return FWD_L2_PROBE == 1 ? (kt & 1) != 0 : FWD_L2_PROBE == 2 ? kt >= FWD_STAGES : false;
}
// gridDim.x read where it is used (ptxas hoisted it out of the item loop and spilled it)
__device__ __forceinline__ int grid_ctas() {
  int n;
  asm volatile("mov.u32 %0, %%nctaid.x;\n" : "=r"(n));
  return n;
}
__device__ __forceinline__ void fwd_producer(const FwdV4Params& P, FwdV4Smem& sm) {
  const AttnParams& a = P.a;
  const int lane = threadIdx.x & 31;
  if (lane == 0) prefetch_maps(P);
  u32 ring = 0;
  int code = (int)blockIdx.x < P.nitems ? P.items[blockIdx.x] : -1;
  // item c decoded, this lane's share of u (not lane 4's)
  const auto decode = [&](int c) {
    const int tile = c / a.hq, h = c - tile * a.hq;
    return lane < 4 ? (c >= 0 ? P.tiles[4 * tile + lane] : 0) : lane == 5 ? h : h / (a.hq / a.hkv);
  };
  int u = decode(code);
  if (lane == 4) u = atomicAdd(P.counter, 1) + grid_ctas();
  for (;;) {
    const u32 nq = ring & 0xff;
    const int qb = nq < QSLOTS ? nq : nq - QSLOTS;
    ItemSlot& it = sm.item[qb];
    float kf;  // key group `lane`'s 2^eK and eV of the next key tile (lanes 0..3)
    int ev;
    // key tile kt's exponents; doc0 / len / hk: the item's
    auto load_exps = [&](int kt, int doc0, int len, int hk) {
      const int key = kt * KT + 32 * lane;
      const bool ok = lane < 4 && key < len;
      const long long e = (long long)(doc0 + (ok ? key : 0)) * a.hkv + hk;
      kf = ok ? exp2i(a.k_exp[e]) : 0.f;
      ev = ok ? (int)a.v_exp[e] : -1000;
    };
    int nkt;
    {
      const int h = __shfl_sync(0xffffffffu, u, 5), hk = __shfl_sync(0xffffffffu, u, 6);
      const WorkTile t{__shfl_sync(0xffffffffu, u, 0), __shfl_sync(0xffffffffu, u, 1), __shfl_sync(0xffffffffu, u, 2),
                       __shfl_sync(0xffffffffu, u, 3)};
      nkt = code >= 0 ? fwd_key_tiles(t, a.causal) : 0;
      if (nkt > 0) load_exps(0, t.doc0, t.len, hk);
      mbar_wait(smem_u32(&sm.q_empty[qb]), nq < QSLOTS ? 1 : 0);
      const u32 qbar = smem_u32(&sm.q_full[qb]);
      if (lane == 0) {
        it.code = code;
        it.h = h;
        it.hk = hk;
        it.tile = t;
        if (code >= 0) {  // the Q tile's bytes expected (no arrival yet), its TMA under the qf loads
          mbar_expect_tx(qbar, QT * HEAD_DIM);
          tma_load_3d(smem_u32(sm.q[qb]), &P.q_map, qbar, 0, h, t.doc0 + t.q0);
        }
      }
      {  // rows 4 lane .. 4 lane + 3 (one base pointer, valid while j < nrow)
        const int nrow = code >= 0 ? t.len - t.q0 - 4 * lane : 0;
        const i8* qp = a.q_exp + ((long long)(t.doc0 + t.q0 + 4 * lane) * a.hq + h);
#pragma unroll
        for (int j = 0; j < 4; ++j) it.qf[4 * lane + j] = j < nrow ? exp2i(qp[j * a.hq]) * a.scale_log2 : 0.f;
      }
      mbar_arrive(qbar);  // the 32 lanes, after their qf stores
    }
    if (code < 0) {
      if (lane == 4) sched_done(P.counter);
      return;
    }
    ring = nq + 1 == 2 * QSLOTS ? ring & ~0xffu : ring + 1;
    const int nidx = __shfl_sync(0xffffffffu, u, 4);
    const int ncode = nidx < P.nitems ? P.items[nidx] : -1;  // in flight while the tiles are issued
    if (lane == 4) u = atomicAdd(P.counter, 1) + grid_ctas();
#pragma unroll 1
    for (int kt = 0; kt < nkt; ++kt) {
      const u32 nkv = ring >> 8;
      const int s = nkv < FWD_STAGES ? nkv : nkv - FWD_STAGES;
      mbar_wait(smem_u32(&sm.kv_empty[s]), nkv < FWD_STAGES ? 1 : 0);
      if (lane < 4) {
        sm.kf[s][FWD_TILE_TRIM ? lane : 32 * lane] = kf;  // (FWD_TILE_TRIM: softmax.cuh group_keys)
        sm.ev[s][FWD_TILE_TRIM ? lane : 32 * lane] = ev;
      }
      const u32 bar = smem_u32(&sm.kv_full[s]);
      const int doc0 = it.tile.doc0, hk = it.hk;  // after the wait (its memory clobber): not kept live
      if (lane == 0 && !fwd_l2_probe_skip(kt)) {
        mbar_arrive_expect_tx(bar, 2 * KT * HEAD_DIM);
        tma_load_3d(smem_u32(sm.k[s]), &P.k_map, bar, 0, hk, doc0 + kt * KT);
        tma_load_2d(smem_u32(sm.v[s]), &P.v_map, bar, it.tile.pad0 + kt * KT, hk * HEAD_DIM);
      } else {
        mbar_arrive(bar);
      }
      ring = nkv + 1 == 2 * FWD_STAGES ? ring & 0xffu : ring + 0x100;
      if (kt == 0 && lane != 4) u = decode(ncode);  // after the first tile's TMA
      if (kt + 1 < nkt) load_exps(kt + 1, doc0, it.tile.len, hk);
    }
    code = ncode;
  }
}
#else
// Per-token scales: every key's exponents (4 keys per lane) and the interior tiles' per-key P
// folds (sm.vf, sm.evt: the tile's max eV by a warp reduction; FWD_EV_RUN: the running max over
// the item's tiles).
__device__ __forceinline__ void fwd_producer(const FwdV4Params& P, FwdV4Smem& sm) {
  const AttnParams& a = P.a;
  const int lane = threadIdx.x & 31;
  if (lane == 0) prefetch_maps(P);
  int qb = 0, s = 0;
  u32 qph = 0, ph = 0;
  int code = (int)blockIdx.x < P.nitems ? P.items[blockIdx.x] : -1;
  int h = 0;
  WorkTile t{0, 0, 0, 0};
  if (code >= 0) t = sched_tile(P.tiles, code, a.hq, h);
  int next = 0;  // index of the item after this one (lane 0 holds it)
  if (lane == 0) next = atomicAdd(P.counter, 1) + (int)gridDim.x;
  for (;;) {
    const int hk = h / (a.hq / a.hkv), nkt = code >= 0 ? fwd_key_tiles(t, a.causal) : 0;
    // exponents of key tile kt into registers (4 keys per lane)
    float kf[4];
    int ev[4];
    auto load_exps = [&](int kt) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int key = kt * KT + 4 * lane + j;
        const bool ok = key < t.len;
        const long long e = (long long)(t.doc0 + (ok ? key : 0)) * a.hkv + hk;
        kf[j] = ok ? exp2i(a.k_exp[e]) : 0.f;
        ev[j] = ok ? (int)a.v_exp[e] : -1000;
      }
    };
    if (nkt > 0) load_exps(0);
    int evr = -1000;  // (FWD_EV_RUN: the item's running max eV, no key seen yet)
    float qf[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int R = 4 * lane + j;
      const bool ok = code >= 0 && t.q0 + R < t.len;
      qf[j] = ok ? exp2i(a.q_exp[(long long)(t.doc0 + t.q0 + R) * a.hq + h]) * a.scale_log2 : 0.f;
    }
    mbar_wait(smem_u32(&sm.q_empty[qb]), qph ^ 1);
    ItemSlot& it = sm.item[qb];
#pragma unroll
    for (int j = 0; j < 4; ++j) it.qf[4 * lane + j] = qf[j];
    const u32 qbar = smem_u32(&sm.q_full[qb]);
    if (lane == 0) {
      it.code = code;
      it.h = h;
      it.tile = t;
      if (code >= 0) {
        mbar_arrive_expect_tx(qbar, QT * HEAD_DIM);
        tma_load_3d(smem_u32(sm.q[qb]), &P.q_map, qbar, 0, h, t.doc0 + t.q0);
      } else {
        mbar_arrive(qbar);
      }
    } else {
      mbar_arrive(qbar);
    }
    if (code < 0) {
      if (lane == 0) sched_done(P.counter);
      return;
    }
    if (++qb == QSLOTS) { qb = 0; qph ^= 1; }
    const int nidx = __shfl_sync(0xffffffffu, next, 0);
    const int ncode = nidx < P.nitems ? P.items[nidx] : -1;  // in flight while the tiles are issued
    if (lane == 0) next = atomicAdd(P.counter, 1) + (int)gridDim.x;
    int nh = 0;
    WorkTile nt{0, 0, 0, 0};
    for (int kt = 0; kt < nkt; ++kt) {
      mbar_wait(smem_u32(&sm.kv_empty[s]), ph ^ 1);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        sm.kf[s][4 * lane + j] = kf[j];
        sm.ev[s][4 * lane + j] = ev[j];
      }
      {
        int evt = max(max(ev[0], ev[1]), max(ev[2], ev[3]));
#pragma unroll
        for (int o = 16; o; o >>= 1) evt = max(evt, __shfl_xor_sync(0xffffffffu, evt, o));
        // (FWD_EV_RUN: the running maximum over the item's tiles so far; the interior tiles,
        // which alone read vf and evt, are a prefix of the item's tiles that every row of the
        // consumer sees whole, so it is each row's maximum over the keys it has seen)
        if (FWD_EV_RUN) evt = evr = max(evr, evt);
#pragma unroll
        for (int j = 0; j < 4; ++j) sm.vf[s][4 * lane + j] = ev[j] > -1000 ? exp2i(ev[j] - evt + 8) : 0.f;
        if (lane == 0) sm.evt[s] = evt;
      }
      const u32 bar = smem_u32(&sm.kv_full[s]);
      if (lane == 0) {
        mbar_arrive_expect_tx(bar, 2 * KT * HEAD_DIM);
        tma_load_3d(smem_u32(sm.k[s]), &P.k_map, bar, 0, hk, t.doc0 + kt * KT);
        tma_load_2d(smem_u32(sm.v[s]), &P.v_map, bar, t.pad0 + kt * KT, hk * HEAD_DIM);
      } else {
        mbar_arrive(bar);
      }
      if (++s == FWD_STAGES) { s = 0; ph ^= 1; }
      if (kt == 0 && ncode >= 0) nt = sched_tile(P.tiles, ncode, a.hq, nh);  // after the first tile's TMA
      if (kt + 1 < nkt) load_exps(kt + 1);
    }
    code = ncode;
    t = nt;
    h = nh;
  }
}
#endif

#if FWD_QD_WRITE
// FWD_QD_WRITE's warp: per item, once its Q tile has landed (q_full), the tile's rows inside the
// document transposed into sm.qd (zeros past it; xpose.cuh's ldmatrix / stmatrix blocks, since
// the session 22 measurement of the 4-byte version: not yet run on a GPU), the Q slot released
// (q_empty counts this warp), and the boxes inside the document's padded span stored to q_dim.
__device__ __forceinline__ void fwd_qd_writer(const FwdV4Params& P, FwdV4Smem& sm) {
  const int lane = threadIdx.x & 31;
  if (lane == 0) tma_prefetch(&P.qd_map);
  int qb = 0;
  u32 qph = 0;
  for (;;) {
    mbar_wait(smem_u32(&sm.q_full[qb]), qph);
    const ItemSlot& it = sm.item[qb];
    if (it.code < 0) break;
    const WorkTile t = it.tile;
    const int h = it.h;
    const int rows = min(QT, t.len - t.q0);                         // Q rows inside the document
    const int boxes = (min(QT, ((t.len + 63) & ~63) - t.q0) + 63) / 64;  // 64-position boxes to store
    if (lane == 0) bulk_wait_read_all();  // the previous item's stores have read the staging tiles
    __syncwarp();
    // 16 x 16-byte blocks two at a time (xpose.cuh): token block a of the tile, dim blocks c, c + 1
    const auto tok = [](int row, int byte) { return tok_off(row, byte); };
    const auto pos = [](int dim, int p) { return (p >> 6) * (HEAD_DIM * 64) + sw64_off(dim, p & 63); };
#pragma unroll 1
    for (int a = 0; a < 4 * boxes; ++a)
#pragma unroll 1
      for (int c = 0; c < HEAD_DIM / 16; c += 2)
        xpose_blocks_ldsm(sm.q[qb], sm.qd[0], tok, pos, a, c, a, c + 1, rows, FWD_QD_PERM, lane);
    fence_async_smem();  // the staging writes -> the async proxy (the bulk stores read them)
    __syncwarp();
    if (lane == 0) {
      mbar_arrive(smem_u32(&sm.q_empty[qb]));
      for (int b = 0; b < boxes; ++b) tma_store_2d(&P.qd_map, smem_u32(sm.qd[b]), t.pad0 + t.q0 + 64 * b, h * HEAD_DIM);
      bulk_commit();
    }
    if (++qb == QSLOTS) { qb = 0; qph ^= 1; }
  }
  if (lane == 0) bulk_wait_all();  // (the stores complete before the CTA's shared memory goes)
}
#endif

// FWD_PINGPONG = 1: the two consumer warpgroups take turns issuing their S products (named
// barriers 1 and 2, FA3's warp-scheduler barrier), so one warpgroup's softmax runs while the other's
// products are in the tensor cores. Warpgroup 1 starts by passing the turn; warpgroup 0 absorbs
// the last pass when the kernel ends. Every key tile takes and passes the turn once, the tiles a
// warpgroup only passes on (no rows in the document) too. (Measured twice, +4..+13%: a turn
// around S alone is passed at once, so the two softmaxes still run side by side. Session 34
// measured turns around each warpgroup's whole product phase, PV of tile k through S of tile
// k + 1, so that the softmaxes alternate: forward +15..+21% at both head dims, bitwise the same
// outputs; commit 8467625 has it. The softmax is latency-bound (~0.3 instructions per clock per
// warp), so two of them side by side share the SMSPs well, and serialising them costs more than
// the products they would hide.)
#ifndef FWD_PINGPONG
#define FWD_PINGPONG 0
#endif
__device__ __forceinline__ void turn_take(int cw) {
  if (FWD_PINGPONG) named_sync(1 + cw, 256);
}
__device__ __forceinline__ void turn_pass(int cw) {
  if (FWD_PINGPONG) named_arrive(2 - cw, 256);
}

// P' (the 64 x 128 score fragment, E4M3-ready; a half tile's 32 scores, FWD_HALF_TILES) -> PV's
// A fragments (32 keys each).
// FWD_VPERM 1 (attention.rs fwd_vperm; the host's default since session 43, FLAMIA_FWD_VPERM=0
// switches it off): straight into the key-permuted fragments by cvt_e4m3x4 (slice_afrag_cvt4: two F2FP a
// register), V's dim-major copy holding the matching key order in each 32-key block
// (DimOrder::QueryPerm, as Q's and dO's copies for BWD_QPERM; the v4 backward's in-place V
// transpose puts the keys back, BWD_VT_VPERM): the same pairs multiplied in every k32 slice, so
// bitwise the same O. 594 -> 520 SASS per interior key tile at d = 128 (the quad shuffles, their
// selects and the byte permutes gone), 548 -> 499 at d = 64. 0: the exact column order
// (acc_to_afrag: four shuffles, selects and PRMT per slice). (Session 15's FWD_VPERM packed code
// pairs with a PRMT per register, 621 -> 607 SASS, and measured +1.0% at 1x65536: removed then.)
#ifndef FWD_VPERM
#define FWD_VPERM 0
#endif
template <int NS>
__device__ __forceinline__ void p_to_afrag(const float (&sc)[NS], u32 (&pa)[NS / 16][4]) {
#if FWD_VPERM
#pragma unroll
  for (int kk = 0; kk < NS / 16; ++kk) slice_afrag_cvt4(sc, kk, pa[kk]);
#else
#pragma unroll
  for (int h = 0; h < NS / 32; ++h)
    acc_to_afrag<false>(*reinterpret_cast<const float(*)[32]>(&sc[32 * h]), *reinterpret_cast<u32(*)[2][4]>(&pa[2 * h][0]));
#endif
}

// FWD_DESC_ADD 1 (attention.rs forward_v4_build; the host's default since session 43,
// FLAMIA_FWD_DESC_ADD=0 switches it off): each product's K-slice descriptors as the tile's descriptor plus
// 2 kk in the start-address field (desc_add, as the backward builds its own), instead of each
// rebuilt from its address (mask, shift, or, the constant high word): the same 64-bit values
// (tiles are 1024-byte aligned below 2^18), so the same products. 520 -> 505 SASS per interior
// key tile at d = 128 with FWD_VPERM (the uniform datapath's ULOP3 16 -> 4, USHF 8 -> 2), 499 ->
// 489 at d = 64.
#ifndef FWD_DESC_ADD
#define FWD_DESC_ADD 0
#endif
template <u64 (*DESC)(u32)>
__device__ __forceinline__ u64 slice_desc(u32 tile, int kk) {
  return FWD_DESC_ADD ? desc_add(DESC(tile), 32 * kk) : DESC(tile + 32 * kk);
}

// acc[64 x N] = A (E4M3 fragments, KS K slices of 32) * B^T, B a 128-byte-swizzled [N x 128 bytes]
// tile (N = 2R: the dim-major V tile's HEAD_DIM rows), its first 32 KS keys.
template <int R, int KS>
__device__ __forceinline__ void mma_rs_k128(float (&acc)[R], const u32 (&a)[KS][4], u32 b) {
  wg_fence();
#pragma unroll
  for (int kk = 0; kk < KS; ++kk) wgmma_rs_k32_e4m3(acc, a[kk], slice_desc<desc_sw128>(b, kk), kk > 0);
  wg_commit();
  wg_wait<0>();
  fence_regs(acc);
}

// One key tile of a consumer warpgroup: S, the softmax (masked or interior copy), PV, the stage
// released, O updated. The interior and masked tiles run in two separate loops (the interior ones
// first: they are a prefix of every item's key tiles), so neither loop body branches around the
// .aligned wgmma instructions. (FA3's intra-warpgroup pipeline, S of tile kt+1 issued before PV
// of tile kt and the softmax of kt+1 under PV, was measured and removed three times: session 8's
// fwd-overlap branch, session 14's FWD_OVERLAP (commit 386b083) and FWD_OVERLAP again on the
// lean producer at 240 / 24 registers (commit 3e3ca3e): +1.4% at 1x65536 d = 128, -0.3..-6.2%
// elsewhere, no better than the lean producer alone at d = 64.)
// (Session 35, commit 661ee81: the O update of tile kt deferred under tile kt+1's S product, the
// PV result carried as pending state, FWD_O_LATE; at d = 128 it needs the consumers at 240
// registers, or Q's S operand from shared memory besides. ncu had the update at ~170-210 of the
// tile's ~2,700 clocks right before an S wait of ~290 idle ones. Bitwise the same outputs;
// forward +2.5% at 1x65536, +13..+15% at 64x1024 and 256x256, d = 64 within 1%: removed.)
// NS = 32 (FWD_HALF_TILES): a masked tile no row of the warpgroup sees past its key 63 (the
// first warpgroup's diagonal tile, a document ending in the tile's first half) computes S and PV
// over those 64 keys only (m64n64 S products, two PV slices): the other keys' P would be exact
// zeros, which add nothing to the row sums or (truncated or not) to PV's FP8 accumulator, so
// bitwise the same O and LSE (GPU test forward_half_tiles_give_bitwise_the_same).
template <bool MASKED, int NS = 64>
__device__ __forceinline__ void fwd_tile(FwdV4Smem& sm, int s, const u32 (&qa)[DK_SLICES][4], RowState& st, float (&o)[HEAD_DIM / 2],
                                         int R0, const TileMask& mk) {
  float sc[NS];
  turn_take(R0 >> 6);
  wg_fence();
#pragma unroll
  for (int kk = 0; kk < DK_SLICES; ++kk) {
    if constexpr (NS == 64)
      wgmma_rs_m64n128k32_e4m3(sc, qa[kk], slice_desc<desc_tok>(smem_u32(sm.k[s]), kk), kk > 0);
    else
      wgmma_rs_m64n64k32_e4m3(sc, qa[kk], slice_desc<desc_tok>(smem_u32(sm.k[s]), kk), kk > 0);
  }
  wg_commit();
  turn_pass(R0 >> 6);
  wg_wait<0>();
  fence_regs(sc);
  float alpha_o[2];
#if PER_TOKEN_COLS
  softmax_tile<MASKED, NS>(sc, st, sm.kf[s], sm.ev[s], sm.vf[s], sm.evt[s], R0, mk, alpha_o);
#else
  softmax_tile<MASKED, NS>(sc, st, sm.kf[s], sm.ev[s], nullptr, 0, R0, mk, alpha_o);
#endif
  u32 pa[NS / 16][4];
  p_to_afrag(sc, pa);
  float pv[HEAD_DIM / 2];
  mma_rs_k128(pv, pa, smem_u32(sm.v[s]));
  if ((threadIdx.x & 31) == 0) mbar_arrive(smem_u32(&sm.kv_empty[s]));
#pragma unroll
  for (int i = 0; i < HEAD_DIM / 2; ++i) o[i] = fmaf(o[i], alpha_o[(i >> 1) & 1], pv[i]);
}

// FWD_PROF_TIMERS (timing only, bench/device_s13.sh PHASE=c): thread 0 of each consumer
// warpgroup of CTAs 0-1 sums its clocks waiting for an item's Q slot, waiting for K/V stages, in
// the key tiles (fwd_tile) and in the item's end (store_o_lse), and prints them per item and per
// key tile at the end: the forward's per-item cost on short documents.
#ifdef FWD_PROF_TIMERS
#define FWD_T(v) const long long v = clock64()
#define FWD_ACC(k, v) prof[k] += clock64() - v
#else
#define FWD_T(v)
#define FWD_ACC(k, v)
#endif
__device__ __forceinline__ void fwd_consumer(const FwdV4Params& P, FwdV4Smem& sm, int cw) {
#ifdef FWD_PROF_TIMERS
  long long prof[4] = {0, 0, 0, 0};  // Q wait, K/V waits, key tiles, item end
  int nitems = 0, ntiles = 0;
  const long long t_start = clock64();
  const auto report = [&]() {
    if ((threadIdx.x & 127) == 0 && blockIdx.x < 2)
      printf("fwd4 prof cta %d wg %d: items %d tiles %d clocks %lld | per item: q wait %lld end %lld | per tile: kv wait %lld "
             "tile %lld\n",
             (int)blockIdx.x, cw, nitems, ntiles, clock64() - t_start, prof[0] / max(nitems, 1), prof[3] / max(nitems, 1),
             prof[1] / max(ntiles, 1), prof[2] / max(ntiles, 1));
  };
#endif
  const AttnParams& a = P.a;
  const int t = threadIdx.x & 127, w = t >> 5, lane = t & 31, g = lane >> 2, q = lane & 3;
  const int R0 = 64 * cw + 16 * w + g;  // row of fragment element 0 in the query tile
  int qb = 0, s = 0;
  u32 qph = 0, ph = 0;
  if (cw == 1) turn_pass(cw);  // warpgroup 0 issues first
  for (;;) {
    FWD_T(tq);
    mbar_wait(smem_u32(&sm.q_full[qb]), qph);
    FWD_ACC(0, tq);
    const ItemSlot& it = sm.item[qb];
    if (it.code < 0) {
      if (cw == 0) turn_take(cw);  // absorb warpgroup 1's last pass: the barriers end balanced
#if FWD_O_TMA
      if (t == 0) bulk_wait_all();  // (the O stores complete before the CTA's shared memory goes)
#endif
#ifdef FWD_PROF_TIMERS
      report();
#endif
      return;
    }
    const int h = it.h;
    const WorkTile tile = it.tile;
    const int rows = min(QT, tile.len - tile.q0);
    // Q's A fragments (a[kk][r] byte j = Q[row 16w + g + 8(r&1)][32kk + 16(r>>1) + 4q + j])
    u32 qa[DK_SLICES][4];
    const u8* qs = sm.q[qb] + 64 * cw * HEAD_DIM;
#pragma unroll
    for (int kk = 0; kk < DK_SLICES; ++kk)
#pragma unroll
      for (int r = 0; r < 4; ++r)
        qa[kk][r] = *reinterpret_cast<const u32*>(qs + tok_off(16 * w + g + 8 * (r & 1), 32 * kk + 16 * (r >> 1) + 4 * q));
    RowState st;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int R = R0 + 8 * r;
      st.qf[r] = it.qf[R];
      st.m[r] = NEG_INF;
      st.l[r] = 0.f;
      st.evo[r] = FWD_EV_RUN ? -1000 : 0;  // (FWD_EV_RUN: no group seen yet)
    }
    mbar_arrive(smem_u32(&sm.q_empty[qb]));
    if (++qb == QSLOTS) { qb = 0; qph ^= 1; }

    const int nkt = fwd_key_tiles(tile, a.causal);
    if (64 * cw >= rows) {  // no row of this warpgroup in the document: only pass the stages on
      for (int kt = 0; kt < nkt; ++kt) {
        mbar_wait(smem_u32(&sm.kv_full[s]), ph);
        turn_take(cw);
        turn_pass(cw);
        if (lane == 0) mbar_arrive(smem_u32(&sm.kv_empty[s]));
        if (++s == FWD_STAGES) { s = 0; ph ^= 1; }
      }
      continue;
    }
    float o[HEAD_DIM / 2];
#pragma unroll
    for (int i = 0; i < HEAD_DIM / 2; ++i) o[i] = 0.f;
    // Interior tiles (every row of this warpgroup sees every key): a prefix of the key tiles.
#if defined(FWD_INTERIOR_ONLY)  // instruction census builds (scripts/kernel-regs.py --per-score): wrong results
    const int nfull = nkt;
#elif defined(FWD_MASKED_ONLY)
    const int nfull = 0;
#else
    const int nfull = (64 * cw + 64 <= rows) ? min(tile.len / KT, a.causal ? (tile.q0 + 64 * cw + 1) / KT : nkt) : 0;
#endif
    for (int kt = 0; kt < nfull; ++kt) {
      FWD_T(tk);
      mbar_wait(smem_u32(&sm.kv_full[s]), ph);
      FWD_ACC(1, tk);
      FWD_T(tt);
      fwd_tile<false>(sm, s, qa, st, o, R0, TileMask{KT, rows, tile.q0 - kt * KT, a.causal});
      FWD_ACC(2, tt);
      if (++s == FWD_STAGES) { s = 0; ph ^= 1; }
    }
    for (int kt = nfull; kt < nkt; ++kt) {
      FWD_T(tk);
      mbar_wait(smem_u32(&sm.kv_full[s]), ph);
      FWD_ACC(1, tk);
      FWD_T(tt);
      const TileMask mk{min(KT, tile.len - kt * KT), rows, tile.q0 - kt * KT, a.causal};
#if FWD_HALF_TILES
      // no row of this warpgroup sees past the tile's key 63 (its last row's last key; rows past
      // the document see none); warp-uniform: one value for the whole warpgroup
      if (mk.last(min(64 * cw + 63, rows - 1)) < 64)
        fwd_tile<true, 32>(sm, s, qa, st, o, R0, mk);
      else
#endif
        fwd_tile<true>(sm, s, qa, st, o, R0, mk);
      FWD_ACC(2, tt);
      if (++s == FWD_STAGES) { s = 0; ph ^= 1; }
    }
    FWD_T(te);
#if FWD_O_TMA
    if (64 * cw + 64 <= rows)
      store_o_lse_tma(o, st, a.lse, (long long)tile.doc0 + tile.q0 + R0, a.hq, h, smem_u32(sm.os[cw]), &P.o_map,
                      tile.doc0 + tile.q0 + 64 * cw, 3 + cw);
    else
#endif
      store_o_lse(o, st, a.o, a.lse, (long long)tile.doc0 + tile.q0 + R0, a.hq, h, R0 < rows, R0 + 8 < rows);
    FWD_ACC(3, te);
#ifdef FWD_PROF_TIMERS
    ++nitems;
    ntiles += nkt;
#endif
  }
}
#undef FWD_T
#undef FWD_ACC

extern "C" __global__ void __launch_bounds__(384, 1) attn_fwd_v4(const __grid_constant__ FwdV4Params P) {
  extern __shared__ u8 smem_raw[];
  FwdV4Smem& sm = *reinterpret_cast<FwdV4Smem*>(smem_aligned_1024(smem_raw));
  // warp-uniform to ptxas (a __shfl_sync broadcast): the consumer copies' branch is uniform, and
  // the single body's wgmma descriptors live in uniform registers (session 25: 621 -> 605 SASS
  // per interior key tile at d = 128, 560 -> 548 at 64; the copies have 619)
  const int wg = __shfl_sync(0xffffffffu, threadIdx.x >> 7, 0);
  if (threadIdx.x == 0) {
    for (int b = 0; b < QSLOTS; ++b) {
      mbar_init(smem_u32(&sm.q_full[b]), 32);
      mbar_init(smem_u32(&sm.q_empty[b]), 256 + FWD_QD_WRITE);  // (+ lane 0 of the Q writer)
    }
    for (int s = 0; s < FWD_STAGES; ++s) {
      mbar_init(smem_u32(&sm.kv_full[s]), 32);
      mbar_init(smem_u32(&sm.kv_empty[s]), 8);
    }
    mbar_init_fence();
  }
  __syncthreads();
  pdl_wait();  // (chained launch: the quantiser's codes, the counter's reset)
  pdl_trigger();
  if (wg == 0) {
    regs_dealloc<FWD_PROD_REGS>();
    if (threadIdx.x < 32) fwd_producer(P, sm);
#if FWD_QD_WRITE
    else if (threadIdx.x < 64) fwd_qd_writer(P, sm);
#endif
  } else {
    regs_alloc<FWD_CONS_REGS>();
#if FWD_CW_CONST
    consumer_copies(wg, [&](int cw) { fwd_consumer(P, sm, cw); });
#else
    fwd_consumer(P, sm, wg - 1);
#endif
  }
}
