// Shared helpers of every FLAMIA kernel: integer types, BF16 packing, shared-memory matrix
// descriptors and the no-swizzle K-major tile layout that wgmma reads, async-proxy fences.
// No system headers: NVRTC compiles this with nothing but the embedded sources.
#pragma once

typedef unsigned char u8;
typedef signed char i8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;

#ifdef FLAMIA_FORCE_ERROR
FLAMIA_FORCE_ERROR_is_not_defined_on_purpose;  // lets the runtime test see a compile log
#endif

// Head dim of the module (a variant define: src/gpu/runtime.rs Variant; 128 when not given). The
// v4 kernels and the E4M3 quantiser are written for 64 and 128; the v3.1 kernels for 128 only.
#ifndef HEAD_DIM
#define HEAD_DIM 128
#endif
static_assert(HEAD_DIM == 64 || HEAD_DIM == 128, "HEAD_DIM must be 64 or 128");
#define NEG_INF (-__int_as_float(0x7f800000))

// ---- BF16 <-> FP32 ------------------------------------------------------------------------
__device__ __forceinline__ float bf16_to_f32(u16 h) { return __int_as_float(((u32)h) << 16); }
// Round to nearest even; the first source goes to the UPPER half (PTX cvt semantics).
__device__ __forceinline__ u32 pack_bf16x2(float lo, float hi) {
  u32 r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

// ---- programmatic dependent launch ----------------------------------------------------------
// The host launches the training call's kernels with programmatic stream serialisation
// (src/gpu/runtime.rs launch_chained): a kernel may then start while the previous kernel of the
// stream still runs, so its set-up (barriers, register split, tensor-map prefetch) overlaps the
// other's tail and the launch latency. pdl_wait() blocks until the previous kernel has completed
// and its memory is visible; every chained kernel calls it before its first global-memory access
// (without the attribute it returns at once). pdl_trigger(), after the wait, lets the next
// kernel's CTAs be placed as this grid's CTAs leave (they wait in their own pdl_wait).
__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;\n" ::: "memory"); }
__device__ __forceinline__ void pdl_trigger() { asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory"); }

// ---- shared memory -------------------------------------------------------------------------
__device__ __forceinline__ u32 smem_u32(const void* p) { return (u32)__cvta_generic_to_shared(p); }

// stmatrix.m8n8.x4 (.trans): this lane's row address `a` of matrix lane / 8; r0..r3 are this
// thread's 16-bit pairs of matrices 0..3 (row lane / 4, elements 2 (lane % 4), + 1; transposed
// with .trans). One copy of the asm for xpose.cuh's transposes and the backward's dS tile and
// dQ partial.
__device__ __forceinline__ void stsm_x4(u32 a, u32 r0, u32 r1, u32 r2, u32 r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(a), "r"(r0), "r"(r1), "r"(r2),
               "r"(r3)
               : "memory");
}
__device__ __forceinline__ void stsm_x4_trans(u32 a, u32 r0, u32 r1, u32 r2, u32 r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(a), "r"(r0), "r"(r1),
               "r"(r2), "r"(r3)
               : "memory");
}

// Dynamic shared memory rounded up to 1024 bytes (the host allocates 1024 extra bytes).
__device__ __forceinline__ u8* smem_aligned_1024(u8* raw) {
  u32 a = smem_u32(raw);
  return raw + ((1024u - (a & 1023u)) & 1023u);
}

// wgmma shared-memory matrix descriptor (PTX ISA "Matrix Descriptor Format"): start >> 4 in bits
// 0-13, leading byte offset >> 4 in 16-29, stride byte offset >> 4 in 32-45, swizzle in 62-63.
__device__ __forceinline__ u64 make_desc(u32 saddr, u32 lbo, u32 sbo) {
  u64 d = 0;
  d |= (u64)((saddr & 0x3FFFFu) >> 4);
  d |= (u64)((lbo & 0x3FFFFu) >> 4) << 16;
  d |= (u64)((sbo & 0x3FFFFu) >> 4) << 32;
  return d;  // swizzle 0 (none)
}

// The descriptor of a tile `bytes` further on (a K slice of the same tile): the start address
// field (bits 0-13, address >> 4) grows by bytes >> 4. Shared-memory addresses stay below 2^18,
// so the field never carries into the LBO bits above it, and only the low word changes (one
// uniform add per descriptor instead of rebuilding it from the address).
__device__ __forceinline__ u64 desc_add(u64 d, u32 bytes) {
  u32 lo, hi;
  asm("mov.b64 {%0, %1}, %2;" : "=r"(lo), "=r"(hi) : "l"(d));
  lo += bytes >> 4;
  asm("mov.b64 %0, {%1, %2};" : "=l"(d) : "r"(lo), "r"(hi));
  return d;
}

// No-swizzle K-major tile of ROWS rows x KB bytes of K (KB a multiple of 16). A core matrix is
// 8 rows x 16 bytes stored as 128 contiguous bytes; K-neighbouring core matrices are 128 bytes
// apart (LBO), 8-row groups KB*8 bytes apart (SBO). Verified layout: wgmma-fp8-notes.md 2.
template <int KB>
__device__ __forceinline__ u32 tile_off(u32 r, u32 k) {
  return (r >> 3) * (KB * 8u) + (k >> 4) * 128u + (r & 7u) * 16u + (k & 15u);
}

// Descriptor of the 32-byte K slice `kk` of such a tile (one k32 step of FP8, one k16 step of BF16).
template <int KB>
__device__ __forceinline__ u64 desc_slice(u32 tile, int kk) {
  return make_desc(tile + 256u * kk, 128u, KB * 8u);
}

// Copies ROWS rows of KB bytes (row r at g + r * stride, 16-byte aligned) into a tile; rows at
// or past `valid` are zero. Thread mapping keeps 8 consecutive threads on 8 rows of one core
// matrix (one 128-byte bank sweep per quarter warp).
template <int ROWS, int KB>
__device__ __forceinline__ void load_tile(u8* s, const u8* g, long long stride, int valid, int tid, int nthreads) {
  constexpr int CH = KB / 16;  // 16-byte chunks per row
  for (int c = tid; c < ROWS * CH; c += nthreads) {
    int r = (c / (8 * CH)) * 8 + (c & 7);
    int k = ((c >> 3) % CH) * 16;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (r < valid) v = *reinterpret_cast<const uint4*>(g + r * stride + k);
    *reinterpret_cast<uint4*>(s + tile_off<KB>(r, k)) = v;
  }
}

// Shared memory written with ordinary stores is read by wgmma through the async proxy.
__device__ __forceinline__ void fence_async_smem() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// Byte transpose of a 4 x 4 block: o[i] holds byte i of x[0], x[1], x[2], x[3] (low to high),
// i.e. four tokens' codes of dim i when x[u] is token u's word of four dims (the quantiser's
// dim-major copy, the v4 backward's BWD_KD_XPOSE).
__device__ __forceinline__ void transpose_bytes_4x4(const u32* x, u32* o) {
  const u32 a0 = __byte_perm(x[0], x[1], 0x5140), a1 = __byte_perm(x[0], x[1], 0x7362);
  const u32 b0 = __byte_perm(x[2], x[3], 0x5140), b1 = __byte_perm(x[2], x[3], 0x7362);
  o[0] = __byte_perm(a0, b0, 0x5410);
  o[1] = __byte_perm(a0, b0, 0x7632);
  o[2] = __byte_perm(a1, b1, 0x5410);
  o[3] = __byte_perm(a1, b1, 0x7632);
}

__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wg_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory"); }

// Keeps the compiler from moving accumulator reads above wgmma.wait_group (names no registers).
template <int R>
__device__ __forceinline__ void fence_regs(float (&d)[R]) {
#pragma unroll
  for (int i = 0; i < R; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
template <int R>
__device__ __forceinline__ void fence_regs_u(u32 (&d)[R]) {
#pragma unroll
  for (int i = 0; i < R; ++i) asm volatile("" : "+r"(d[i])::"memory");
}

// Hides a value's origin from the optimiser, so what is computed from it stays where it is
// written: a shared-memory address made opaque per loop iteration keeps the wgmma descriptors
// built from it inside the loop (cheap uniform-datapath integer ops) instead of hoisted out and
// spilled to local memory across the loop body.
__device__ __forceinline__ u32 opaque_u32(u32 x) {
  asm volatile("" : "+r"(x));
  return x;
}

// Maximum over the four lanes of a quad (lane & 3: one accumulator row's columns).
__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ int quad_max_i(int v) {
  v = max(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return max(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// warp_max of values that are >= +0 and not NaN (e.g. an fmaxf chain of fabsf values started at
// +0): the bit patterns of such floats order as their values, so one redux.sync on the bits (sm_80+)
// is warp_max's result exactly, in one instruction instead of five shuffles and five FMNMX.
__device__ __forceinline__ float warp_max_nonneg(float v) {
  u32 r;
  asm volatile("redux.sync.max.u32 %0, %1, 0xffffffff;\n" : "=r"(r) : "r"(__float_as_uint(v)));
  return __uint_as_float(r);
}

// 4x4 transpose of 32-bit words across the four threads of a quad (q = lane & 3): afterwards
// thread q holds word q of each of the four threads, in thread order. Two butterfly rounds.
__device__ __forceinline__ void quad_transpose(u32 (&w)[4], int q) {
  const bool b0 = q & 1, b1 = q & 2;
#pragma unroll
  for (int p = 0; p < 4; p += 2) {  // words whose index bit 0 differs from q's swap with lane ^ 1
    const u32 v = __shfl_xor_sync(0xffffffffu, b0 ? w[p] : w[p + 1], 1);
    if (b0) w[p] = v;
    else w[p + 1] = v;
  }
#pragma unroll
  for (int p = 0; p < 2; ++p) {  // then bit 1 with lane ^ 2
    const u32 v = __shfl_xor_sync(0xffffffffu, b1 ? w[p] : w[p + 2], 2);
    if (b1) w[p] = v;
    else w[p + 2] = v;
  }
}

// Row r (0: fragment rows 0..7, 1: rows 8..15) of this thread's m64nN FP32 accumulator fragment
// (N = 2R: 128 or 64 columns), times f, as N BF16 at `out` (the row's start), 16 bytes per store:
// the quad's 4-byte column pairs of blocks 4J..4J+3 go through quad_transpose so thread q writes
// block 4J + q whole (full sectors; the fragment layout's 4-byte stores wrote half sectors). All
// 32 lanes must call it (shuffles); `valid` only gates the stores.
// (its pieces: put(o, piece) per 16-byte piece, o = 8 (4J + q) the piece's first column, as the
// attention backward's bulk stores stage them in shared memory too: bwd_rows_bulk)
template <int R, class Put>
__device__ __forceinline__ void frag_row_bf16_pieces(const float (&x)[R], int r, float f, Put&& put) {
  const int q = threadIdx.x & 3;
#pragma unroll
  for (int J = 0; J < R / 16; ++J) {
    u32 w[4];
#pragma unroll
    for (int jj = 0; jj < 4; ++jj) {
      const int j = 4 * J + jj;
      w[jj] = pack_bf16x2(x[4 * j + 2 * r] * f, x[4 * j + 2 * r + 1] * f);
    }
    quad_transpose(w, q);
    put(8 * (4 * J + q), make_uint4(w[0], w[1], w[2], w[3]));
  }
}
template <int R>
__device__ __forceinline__ void store_frag_row_bf16(const float (&x)[R], int r, float f, u16* out, bool valid) {
  frag_row_bf16_pieces(x, r, f, [&](int o, uint4 piece) {
    if (valid) *reinterpret_cast<uint4*>(out + o) = piece;
  });
}

// As store_frag_row_bf16, 8 bytes per store: per pair of 8-column blocks (2k, 2k + 1) one word
// goes to lane ^ 1, after which an even q holds columns 16k + 2q .. + 3 (its own and its
// partner's word of block 2k) and an odd q columns 16k + 2q + 6 .. + 9 (its partner's and its own
// of block 2k + 1), so a quad still writes each 32-byte sector whole: per two words one shuffle
// and three selects instead of two and six, and one 8-byte store instead of half a 16-byte one.
// The stores are predicated, at immediate offsets from one address (written as `if (valid) *p =`,
// ptxas branched around each store and recomputed its address inside: ~12 instructions each).
template <int K, int R>
__device__ __forceinline__ void store_bf16_x8_pair(const float (&x)[R], int r, float f, u64 o, bool b0, u32 valid) {
  const u32 a = pack_bf16x2(x[8 * K + 2 * r] * f, x[8 * K + 2 * r + 1] * f);          // block 2K
  const u32 b = pack_bf16x2(x[8 * K + 4 + 2 * r] * f, x[8 * K + 4 + 2 * r + 1] * f);  // block 2K + 1
  const u32 v = __shfl_xor_sync(0xffffffffu, b0 ? a : b, 1);
  const u32 lo = b0 ? v : a, hi = b0 ? b : v;
  asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %3, 0;\n @p st.global.v2.b32 [%0+%4], {%1, %2};\n}\n" ::"l"(o),
               "r"(lo), "r"(hi), "r"(valid), "n"(32 * K)
               : "memory");
  if constexpr (K + 1 < R / 8) store_bf16_x8_pair<K + 1>(x, r, f, o, b0, valid);
}

template <int R>
__device__ __forceinline__ void store_frag_row_bf16_x8(const float (&x)[R], int r, float f, u16* out, bool valid) {
  const int q = threadIdx.x & 3;
  const bool b0 = q & 1;
  store_bf16_x8_pair<0>(x, r, f, reinterpret_cast<u64>(out + 2 * q + (b0 ? 6 : 0)), b0, (u32)valid);
}

// An m64n{HEAD_DIM} FP32 fragment (rows 16 w + g and + 8 of a warpgroup's 64; row r scaled by f[r])
// in BF16 into `stage`: HEAD_DIM / 64 boxes of 64 rows x 128 bytes (64 BF16 dims, 128-byte
// swizzle, 1024-byte aligned), what a bulk tensor store of a (64 dims, 1 head, 64 rows) box reads.
// One stmatrix.x4 per 16 dims writes the fragment's rows g and g + 8 of two 8-dim blocks. t: the
// thread's index in its warpgroup. Users: the forward's O (store_o_lse_tma), the v4 backward's
// dK and dV (BWD_BULK_ST).
__device__ __forceinline__ void stage_frag_bf16_sw128(const float (&o)[HEAD_DIM / 2], const float (&f)[2], u32 stage, int t,
                                                      int lane) {
  // this lane's stmatrix row: matrix m = lane / 8 is rows 16 w + 8 (m & 1) .. + 7 of block 2J + (m >> 1)
  const u32 row = 16 * (t >> 5) + (lane & 7) + 8 * ((lane >> 3) & 1), hi = lane >> 4;
#pragma unroll
  for (int J = 0; J < HEAD_DIM / 16; ++J) {
    const u32 blk = 2 * J + hi;  // 8-dim block: box blk / 8, 16-byte chunk blk % 8 of the row
    const u32 a = stage + (blk >> 3) * 8192u + row * 128u + (((blk & 7u) ^ (row & 7u)) << 4);
    stsm_x4(a, pack_bf16x2(o[8 * J] * f[0], o[8 * J + 1] * f[0]), pack_bf16x2(o[8 * J + 2] * f[1], o[8 * J + 3] * f[1]),
            pack_bf16x2(o[8 * J + 4] * f[0], o[8 * J + 5] * f[0]), pack_bf16x2(o[8 * J + 6] * f[1], o[8 * J + 7] * f[1]));
  }
}
