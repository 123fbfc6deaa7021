// Benchmark helpers: fill a BF16 buffer with N(0, sigma^2) values from a counter-based hash
// (every element independent of the launch shape), so benchmarks never time zeros.
#include "common.cuh"
#include "tma.cuh"  // sm_copy's bulk copies and barriers

__device__ __forceinline__ u32 hash32(u32 x) {
  x ^= x >> 16; x *= 0x7feb352du; x ^= x >> 15; x *= 0x846ca68bu; x ^= x >> 16;
  return x;
}

extern "C" __global__ void fill_normal_bf16(u16* out, long long n, u32 seed, float sigma) {
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
    u32 a = hash32((u32)i * 2u + seed * 0x9E3779B9u), b = hash32((u32)i * 2u + 1u + seed * 0x85EBCA6Bu);
    float u1 = ((a >> 8) + 1) * (1.f / 16777217.f), u2 = (b >> 8) * (1.f / 16777216.f);
    float z = sqrtf(-2.f * __logf(u1)) * __cosf(6.2831853f * u2);
    out[i] = (u16)(pack_bf16x2(z * sigma, 0.f) & 0xffffu);
  }
}

// The SM clock over a short spin (FLAMIA_BENCH_SAMPLES=1): thread 0 spins for `ns` nanoseconds
// of the global timer and writes the SM cycles and the nanoseconds that passed, so cycles / ns is
// the clock (GHz) the SM ran at just then, whatever the driver's sampled clock says.
extern "C" __global__ void clock_probe(unsigned long long* out, long long ns) {
  if (threadIdx.x != 0) return;
  unsigned long long t0, t1;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  long long c0 = clock64();
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t1));
  } while ((long long)(t1 - t0) < ns);
  long long c1 = clock64();
  out[0] = (unsigned long long)(c1 - c0);
  out[1] = t1 - t0;
}

// The rate one SM can move by bulk copies (FLAMIA_BENCH_SMCOPY, session 49: the ceiling of a
// quantiser whose loads and stores are bulk copies, on k SMs or all of them): thread 0 of each CTA streams its chunks (chunk c =
// blockIdx.x + j gridDim.x, `chunk` bytes at src + c chunk) through a ring of `stages`
// shared-memory stages (dynamic, stages x chunk bytes: one CTA per SM) by bulk loads, `stages`
// of them in flight, and sends the first `out` bytes of each back out (dst + c out) by a bulk
// store, as a quantiser reads BF16 and writes codes. Timing only.
extern "C" __global__ void sm_copy(const u8* src, u8* dst, long long nchunks, int chunk, int out, int stages) {
  extern __shared__ __align__(128) u8 ring[];
  __shared__ __align__(8) unsigned long long full[32];
  if (threadIdx.x != 0) return;
  for (int s = 0; s < stages; ++s) mbar_init(smem_u32(&full[s]), 1);
  mbar_init_fence();
  const long long first = blockIdx.x, step = gridDim.x;
  for (int s = 0; s < stages; ++s) {
    const long long c = first + s * step;
    if (c >= nchunks) break;
    const u32 bar = smem_u32(&full[s]);
    mbar_arrive_expect_tx(bar, chunk);
    bulk_load(smem_u32(ring + (long long)s * chunk), src + c * chunk, chunk, bar);
  }
  for (long long j = 0;; ++j) {
    const long long c = first + j * step;
    if (c >= nchunks) break;
    const int s = (int)(j % stages);
    const u32 bar = smem_u32(&full[s]);
    mbar_wait(bar, (u32)((j / stages) & 1));
    bulk_store(dst + c * out, smem_u32(ring + (long long)s * chunk), out);
    bulk_commit();
    asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");  // the stage is free again
    const long long cn = c + stages * step;
    if (cn < nchunks) {
      mbar_arrive_expect_tx(bar, chunk);
      bulk_load(smem_u32(ring + (long long)s * chunk), src + cn * chunk, chunk, bar);
    }
  }
  bulk_wait_all();
}
