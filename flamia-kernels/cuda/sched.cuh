// Persistent longest-first tile scheduling. The host (src/gpu/sched.rs) lists the work items once
// per packing: (128-token query tile of one document, query head), sorted by descending cost (key
// tiles the item visits), the heads of one tile next to each other so the CTAs that stream one
// head's K/V run at the same time and share it in L2. The grid has at most one CTA per SM; a
// CTA's producer takes its first item at blockIdx.x and every later one from a global counter
// (zeroed before each launch), so a CTA that finishes early takes the next longest item.
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
