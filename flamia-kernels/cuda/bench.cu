// Benchmark helpers: fill a BF16 buffer with N(0, sigma^2) values from a counter-based hash
// (every element independent of the launch shape), so benchmarks never time zeros.
#include "common.cuh"

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
