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
