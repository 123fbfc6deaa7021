// Persistent longest-first tile scheduling. The host (src/gpu/sched.rs) lists the work items once
// per packing: (128-token query tile of one document, query head), sorted by descending cost (key
// tiles the item visits), the heads of one tile next to each other so the CTAs that stream one
// head's K/V run at the same time and share it in L2. The grid has at most one CTA per SM; a
// CTA's producer takes its first item at blockIdx.x and every later one from a global counter,
// so a CTA that finishes early takes the next longest item. The counter resets itself at the end
// of each launch (sched_done), so no memset runs between the chained kernels.
#pragma once
#include "common.cuh"

// One 128-token query tile: document start, document length, padded document start (dim-major
// copies), tile offset inside the document. Mirrors the int4 rows of Plan::fwd_tiles.
struct WorkTile {
  int doc0, len, pad0, q0;
};

// Item code -> its tile and head (code = tile * heads + head).
__device__ __forceinline__ WorkTile sched_tile(const int* tiles, int code, int heads, int& head) {
  const int tile = code / heads;
  head = code - tile * heads;
  const int4 v = reinterpret_cast<const int4*>(tiles)[tile];
  return WorkTile{v.x, v.y, v.z, v.w};
}

// The work counter's reset (no memset before each launch): counter[0] hands out item indices,
// counter[1] counts the CTAs whose producer has made its last claim; the last of them zeroes
// both for the next launch. Called once per CTA by the thread that made its claims, after the
// last one: every CTA's claims precede its count (the fence), so the reset follows them all.
__device__ __forceinline__ void sched_done(int* counter) {
#ifndef SCHED_PROF_NORESET  // (mutation sched-noreset: the counter is left as it is)
  __threadfence();
  if (atomicAdd(counter + 1, 1) == (int)gridDim.x - 1) {
    __threadfence();
    atomicExch(counter, 0);
    atomicExch(counter + 1, 0);
  }
#endif
}
