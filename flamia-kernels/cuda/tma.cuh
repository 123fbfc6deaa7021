// The TMA producer / mbarrier pipeline pieces of the warp-specialised kernels (attn_fwd_v4.cu; the
// backward reuses them): tensor maps passed in the __grid_constant__ parameter struct, mbarrier
// init / arrive / wait, bulk tensor loads into 128-byte-swizzled tiles, register reallocation
// between the producer and consumer warpgroups, and the wgmma descriptor of such tiles.
// Verified recipes: shared/design/tma-pipeline-notes.md (ring, parities, swizzle, descriptors).
#pragma once
#include "common.cuh"

// CUtensorMap (128 bytes, 64-byte aligned), built on the host by cuTensorMapEncodeTiled
// (src/gpu/tma.rs). Its address in the parameter space is what cp.async.bulk.tensor takes.
struct __align__(64) TmaMap {
  u64 opaque[16];
};

__device__ __forceinline__ void mbar_init(u32 bar, u32 count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
// Makes the barrier inits visible to the other threads and to the async (TMA) proxy; a CTA-wide
// barrier must follow before anyone uses them.
__device__ __forceinline__ void mbar_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
// Arrives (count 1) and adds `bytes` to the transaction count the current phase waits for.
__device__ __forceinline__ void mbar_arrive_expect_tx(u32 bar, u32 bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
// Adds `bytes` to the transaction count of the barrier's current phase without arriving
// (the arrivals follow: the v4 backward's loads, the forward's lean producer).
__device__ __forceinline__ void mbar_expect_tx(u32 bar, u32 bytes) {
  asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(u32 bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// Spins until the phase of parity `parity` has completed. A fresh barrier counts its "previous"
// phase (parity 1) as complete, so a producer's first wait on an empty slot returns at once.
// CLUSTER: with acquire at cluster scope (the phase was completed by another CTA's arrivals).
template <bool CLUSTER = false>
__device__ __forceinline__ void mbar_wait(u32 bar, u32 parity) {
#define MBAR_SPIN(SEM)                                                                              \
  asm volatile("{\n.reg .pred p;\nMBAR_WAIT:\n"                                                     \
               "mbarrier.try_wait.parity" SEM ".shared::cta.b64 p, [%0], %1;\n"                      \
               "@!p bra MBAR_WAIT;\n}\n" ::"r"(bar),                                                \
               "r"(parity)                                                                         \
               : "memory")
  if constexpr (CLUSTER)
    MBAR_SPIN(".acquire.cluster");
  else
    MBAR_SPIN("");
#undef MBAR_SPIN
}

// One try of mbar_wait (CLUSTER: with acquire at cluster scope): whether the
// phase of parity `parity` has completed.
template <bool CLUSTER = false>
__device__ __forceinline__ bool mbar_try_wait(u32 bar, u32 parity) {
  u32 ok;
#define MBAR_TRY_ONCE(SEM)                                                                                   \
  asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity" SEM ".shared::cta.b64 p, [%1], %2;\nselp.u32 %0, " \
               "1, 0, p;\n}\n"                                                                               \
               : "=r"(ok)                                                                                    \
               : "r"(bar), "r"(parity)                                                                       \
               : "memory")
  if constexpr (CLUSTER)
    MBAR_TRY_ONCE(".acquire.cluster");
  else
    MBAR_TRY_ONCE("");
#undef MBAR_TRY_ONCE
  return ok != 0;
}

__device__ __forceinline__ void tma_prefetch(const TmaMap* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"((u64)map) : "memory");
}
// Box of a 2-D map at element coordinates (x innermost, y) -> smem `dst`; completes on `bar`.
__device__ __forceinline__ void tma_load_2d(u32 dst, const TmaMap* map, u32 bar, int x, int y) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];\n" ::"r"(dst),
      "l"((u64)map), "r"(bar), "r"(x), "r"(y)
      : "memory");
}
// Plain bulk copy of `bytes` (a multiple of 16; both addresses 16-byte aligned) from global memory
// into shared memory, completing on `bar` (no tensor map).
__device__ __forceinline__ void bulk_load(u32 dst, const void* src, u32 bytes, u32 bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
               "l"(src), "r"(bytes), "r"(bar)
               : "memory");
}
// Box of a 3-D map at (x innermost, y, z).
__device__ __forceinline__ void tma_load_3d(u32 dst, const TmaMap* map, u32 bar, int x, int y, int z) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5}], [%2];\n" ::"r"(
          dst),
      "l"((u64)map), "r"(bar), "r"(x), "r"(y), "r"(z)
      : "memory");
}

// ---- clusters (the backward's CTA pairs, BWD_PAIR) ----
// This CTA's rank in its cluster.
__device__ __forceinline__ u32 cluster_ctarank() {
  u32 r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
}
// The shared::cluster address of the same shared-memory offset in CTA `rank` of the cluster.
__device__ __forceinline__ u32 mapa_shared(u32 addr, u32 rank) {
  u32 r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(r) : "r"(addr), "r"(rank));
  return r;
}
// Arrives (count 1) on a barrier of a cluster CTA (`remote`: a mapa_shared address), releasing
// this thread's earlier memory operations at cluster scope.
__device__ __forceinline__ void mbar_arrive_cluster(u32 remote) {
  asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];\n" ::"r"(remote) : "memory");
}
// Arrives (count 1) on a barrier of a cluster CTA with the default semantics (release at CTA
// scope: no fence; in SASS one SYNCS.ARRIVE, where .release.cluster adds MEMBAR.ALL.CTA,
// MEMBAR.ALL.GPU, ERRBAR and CGAERRBAR): for releases whose reads are complete (a stage's
// wgmma waited for, loads whose values were used), as CUTLASS's cluster barriers arrive.
__device__ __forceinline__ void mbar_arrive_remote(u32 remote) {
  asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];\n" ::"r"(remote) : "memory");
}
// This thread's earlier shared-memory stores performed for the CTA (MEMBAR.ALL.CTA) before what
// follows, e.g. an mbar_arrive_remote after which another CTA reads them through DSMEM.
__device__ __forceinline__ void fence_cta() { asm volatile("fence.acq_rel.cta;\n" ::: "memory"); }
__device__ __forceinline__ float4 ld_shared_cluster_v4(u32 remote) {
  float4 v;
  asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];\n"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
               : "r"(remote)
               : "memory");
  return v;
}
// Arrives with count n on a barrier of this CTA.
__device__ __forceinline__ void mbar_arrive_n(u32 bar, u32 n) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(n) : "memory");
}
__device__ __forceinline__ void st_shared_cluster(u32 remote, int v) {
  asm volatile("st.shared::cluster.u32 [%0], %1;\n" ::"r"(remote), "r"(v) : "memory");
}
// Every thread of every CTA of the cluster (release / acquire: the barrier inits, a CTA's exit).
__device__ __forceinline__ void cluster_sync_all() {
  asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;\n" ::: "memory");
}
// tma_load_2d / tma_load_3d into the same offset of every CTA of `mask` (bit r: cluster rank r),
// each CTA's barrier at `bar`'s offset completing the bytes it receives.
__device__ __forceinline__ void tma_load_2d_mc(u32 dst, const TmaMap* map, u32 bar, int x, int y, u16 mask) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1, {%3, "
      "%4}], [%2], %5;\n" ::"r"(dst),
      "l"((u64)map), "r"(bar), "r"(x), "r"(y), "h"(mask)
      : "memory");
}
__device__ __forceinline__ void tma_load_3d_mc(u32 dst, const TmaMap* map, u32 bar, int x, int y, int z, u16 mask) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1, {%3, "
      "%4, %5}], [%2], %6;\n" ::"r"(dst),
      "l"((u64)map), "r"(bar), "r"(x), "r"(y), "r"(z), "h"(mask)
      : "memory");
}

// Box of a 2-D map at (x innermost, y) <- smem `src` (a bulk store: commit, then wait below).
__device__ __forceinline__ void tma_store_2d(const TmaMap* map, u32 src, int x, int y) {
  asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];\n" ::"l"((u64)map), "r"(src),
               "r"(x), "r"(y)
               : "memory");
}
// Box of a 3-D map at (x innermost, y, z) <- smem `src`.
__device__ __forceinline__ void tma_store_3d(const TmaMap* map, u32 src, int x, int y, int z) {
  asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%2, %3, %4}], [%1];\n" ::"l"((u64)map),
               "r"(src), "r"(x), "r"(y), "r"(z)
               : "memory");
}
// `bytes` (a multiple of 16) from smem `src` to global `dst` (16-byte aligned): a bulk store of
// the thread's bulk group (commit, then wait below).
__device__ __forceinline__ void bulk_store(void* dst, u32 src, u32 bytes) {
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n" ::"l"((u64)dst), "r"(src), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void bulk_wait_all() { asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void bulk_wait() { asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(N) : "memory"); }
// The bulk operations of all groups have finished reading their shared-memory sources.
__device__ __forceinline__ void bulk_wait_read_all() { asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory"); }

// setmaxnreg: the producer warpgroup gives registers back, the consumers take them (all threads of
// the warpgroup execute it).
template <int R>
__device__ __forceinline__ void regs_dealloc() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(R));
}
template <int R>
__device__ __forceinline__ void regs_alloc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(R));
}

// The consumer body inlined once per consumer warpgroup (CTA warpgroup 1 or 2), its index cw a
// compile-time constant in each copy, so ptxas keeps what depends on it (wgmma descriptors,
// shared-memory offsets) in uniform registers (FWD_CW_CONST). wg must be warp-uniform to ptxas
// (a __shfl_sync broadcast): on a plain threadIdx-derived value the copies are divergent paths
// and their wgmma get serialised (ptxas C7520). (The backward's copies, session 12's
// BWD_CW_CONST, ran 23-56% slower in session 13 despite 7% fewer instructions per step; the
// likely cause, not measured, is the instruction cache: its consumer code is several times the
// forward's and the two warpgroups ran different copies of it. Removed.)
template <typename F>
__device__ __forceinline__ void consumer_copies(int wg, F&& body) {
  if (wg == 1) {
    body(0);
  } else {
    body(1);
  }
}

// Named barrier over `n` threads (ids 1..15; 0 is __syncthreads).
__device__ __forceinline__ void named_sync(int id, int n) { asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory"); }
__device__ __forceinline__ void named_arrive(int id, int n) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}

// wgmma descriptor of a K-major tile of 128-byte rows written by TMA with the 128-byte swizzle
// (1024-byte aligned): LBO 16 (unused), SBO 1024 (8 rows), mode 1. K slice kk of an FP8 tile
// starts at +32*kk bytes (the hardware applies the XOR after adding).
__device__ __forceinline__ u64 desc_sw128(u32 saddr) {
  return (u64)((saddr & 0x3FFFFu) >> 4) | ((u64)(16u >> 4) << 16) | ((u64)(1024u >> 4) << 32) | ((u64)1 << 62);
}
// Byte offset of (row r, byte k) in such a tile: the 16-byte chunk index is XORed with r % 8.
__device__ __forceinline__ u32 sw128_off(u32 r, u32 k) { return r * 128u + (k ^ ((r & 7u) << 4)); }
// wgmma descriptor of a K-major tile of 64-byte rows written by TMA with the 64-byte swizzle
// (512-byte atoms of 8 rows); K slice kk of an FP8 tile starts at +32*kk bytes.
__device__ __forceinline__ u64 desc_sw64(u32 saddr) {
  return (u64)((saddr & 0x3FFFFu) >> 4) | ((u64)1 << 16) | ((u64)(512u >> 4) << 32) | ((u64)2 << 62);
}
// Byte offset of (row r, byte k) in such a tile: the 16-byte chunk index (address bits 4-5) is
// XORed with address bits 7-8, i.e. with (r / 2) % 4.
__device__ __forceinline__ u32 sw64_off(u32 r, u32 k) { return r * 64u + (k ^ (((r >> 1) & 3u) << 4)); }

// Token-major E4M3 tiles (one row = one token's HEAD_DIM codes) use the swizzle of their row width:
// 128 bytes at HEAD_DIM 128, 64 at HEAD_DIM 64 (the host's TMA maps: src/gpu/tma.rs token_major).
__device__ __forceinline__ u64 desc_tok(u32 saddr) { return HEAD_DIM == 128 ? desc_sw128(saddr) : desc_sw64(saddr); }
__device__ __forceinline__ u32 tok_off(u32 r, u32 k) { return HEAD_DIM == 128 ? sw128_off(r, k) : sw64_off(r, k); }
// K slices of 32 bytes (one k32 wgmma step of E4M3) in a token row.
#define DK_SLICES (HEAD_DIM / 32)
