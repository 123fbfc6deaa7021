// Ready flags between the Q/K/V quantiser and a forward that runs beside it on other SMs
// (QUANT_FLAGS in quant.cu, FWD_QUANT_FLAGS in attn_fwd_v4.cu; host: Attention's overlap, which
// launches the forward first with its persistent grid capped below the SM count and the
// quantiser on a second stream). One 32-bit flag per quantiser chunk item (128 padded positions
// x one head slot: Q's heads, then K's, then V's), flags[c * slots + s]. The quantiser stores
// the call's epoch there (release, after a CTA barrier and a fence that follow every store of
// the item: token-major codes, exponents, the dim-major copy); the forward's producer waits for
// the epoch (acquire) on every chunk a tile spans before it reads the tile's exponents or
// issues its TMA (after a proxy fence: the TMA reads through the async proxy). The epoch
// changes every call, so no reset runs between calls. The quantiser never waits, so the
// forward cannot deadlock it: it only needs SMs the forward leaves or gives up.
#pragma once
#include "common.cuh"

__device__ __forceinline__ u32 qflag_acquire(const u32* p) {
  u32 v;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ void qflag_release(u32* p, u32 v) {
  asm volatile("st.release.gpu.global.b32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}

// Waits until every chunk item of head slot `slot` that holds padded positions pos0 .. pos0 +
// n - 1 has published `epoch` (nothing when n <= 0), then orders the caller's later TMA reads
// after those loads (the async proxy). Every lane of a warp may call it (the same loads).
__device__ __forceinline__ void qflags_wait(const u32* flags, int slots, int slot, int pos0, int n, u32 epoch) {
  if (n <= 0) return;
  for (int c = pos0 >> 7; c <= (pos0 + n - 1) >> 7; ++c) {
    const u32* f = flags + (long long)c * slots + slot;
    while (qflag_acquire(f) != epoch) __nanosleep(32);
  }
  asm volatile("fence.proxy.async.global;\n" ::: "memory");
}
