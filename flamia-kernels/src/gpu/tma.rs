//! TMA tensor maps (`cuTensorMapEncodeTiled`) for the warp-specialised kernels: E4M3 code
//! buffers described as 2-D or 3-D byte tensors whose boxes land in shared memory with the
//! 128-byte swizzle the kernels' wgmma descriptors expect (`cuda/tma.cuh`,
//! shared/design/tma-pipeline-notes.md). A map holds a raw device pointer: build it per call,
//! from the buffers that call reads.

use super::error::{GpuError, GpuResult};
use cudarc::driver::sys;

/// `CUtensorMap` as the kernels' parameter structs hold it (`struct TmaMap` in `cuda/tma.cuh`:
/// 128 bytes, 64-byte aligned).
#[repr(C, align(64))]
#[derive(Clone, Copy, Default)]
pub struct TmaMap(pub [u64; 16]);

impl std::fmt::Debug for TmaMap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TmaMap(..)")
    }
}

/// Element type of a mapped tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Elem {
    /// E4M3 codes (bytes).
    U8,
    /// BF16 (the forward's output O).
    Bf16,
    /// FP32 (the backward's dQ accumulator).
    F32,
}

impl Elem {
    fn bytes(self) -> u64 {
        match self {
            Elem::U8 => 1,
            Elem::Bf16 => 2,
            Elem::F32 => 4,
        }
    }
}

/// Shared-memory swizzle of a map's boxes; the innermost box must span exactly its width.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Swizzle {
    /// 64-byte rows, 512-byte atoms (wgmma descriptor mode 2).
    B64,
    /// 128-byte rows, 1024-byte atoms (wgmma descriptor mode 1).
    B128,
}

impl Swizzle {
    fn span(self) -> u64 {
        match self {
            Swizzle::B64 => 64,
            Swizzle::B128 => 128,
        }
    }
}

/// A tiled map of a byte tensor with the 128-byte swizzle: `dims` innermost first (elements =
/// bytes), `strides` in bytes of dimensions 1.. (multiples of 16), `boxes` the box size per
/// dimension; the innermost box must be 128 bytes (one swizzle span). Out-of-range box elements
/// read as zero.
pub fn encode_u8(ptr: u64, dims: &[u64], strides: &[u64], boxes: &[u32]) -> GpuResult<TmaMap> {
    encode(ptr, Elem::U8, dims, strides, boxes, Swizzle::B128)
}

/// A tiled map of `elem` elements (`dims` in elements, `strides` in bytes) whose innermost box
/// spans exactly one `swizzle` width.
pub fn encode(
    ptr: u64,
    elem: Elem,
    dims: &[u64],
    strides: &[u64],
    boxes: &[u32],
    swizzle: Swizzle,
) -> GpuResult<TmaMap> {
    let rank = dims.len();
    let bad = |why: String| {
        GpuError::NotSupported(format!("TMA map {dims:?} / {strides:?} / box {boxes:?}: {why}"))
    };
    if !(2..=5).contains(&rank) || strides.len() + 1 != rank || boxes.len() != rank {
        return Err(bad("rank 2..5 with rank-1 strides and rank boxes".into()));
    }
    if boxes[0] as u64 * elem.bytes() != swizzle.span() || boxes.iter().any(|b| *b == 0 || *b > 256) {
        return Err(bad(format!(
            "innermost box must be {} bytes (the swizzle span), every box 1..=256",
            swizzle.span()
        )));
    }
    if !ptr.is_multiple_of(16) || strides.iter().any(|s| !s.is_multiple_of(16)) {
        return Err(bad("address and strides must be multiples of 16 bytes".into()));
    }
    let ones = vec![1u32; rank];
    let dtype = match elem {
        Elem::U8 => sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_UINT8,
        Elem::Bf16 => sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
        Elem::F32 => sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_FLOAT32,
    };
    let sw = match swizzle {
        Swizzle::B64 => sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_64B,
        Swizzle::B128 => sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B,
    };
    let mut map = std::mem::MaybeUninit::<sys::CUtensorMap>::zeroed();
    // SAFETY: every array has `rank` (strides: rank - 1) entries as the driver requires; `map` is
    // writable and aligned (CUtensorMap's own alignment).
    unsafe {
        sys::cuTensorMapEncodeTiled(
            map.as_mut_ptr(),
            dtype,
            rank as u32,
            ptr as *mut std::ffi::c_void,
            dims.as_ptr(),
            strides.as_ptr(),
            boxes.as_ptr(),
            ones.as_ptr(),
            sys::CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
            sw,
            sys::CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            sys::CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
        )
    }
    .result()
    .map_err(|err| GpuError::Driver {
        what: format!("cuTensorMapEncodeTiled(dims {dims:?}, strides {strides:?}, box {boxes:?})"),
        err,
    })?;
    // SAFETY: initialised by the successful call above.
    let map = unsafe { map.assume_init() };
    Ok(TmaMap(map.opaque))
}

/// The swizzle of a token row of `hd` E4M3 codes (`desc_tok` in `cuda/tma.cuh`): 128 bytes at head
/// dim 128, 64 at 64.
fn token_swizzle(hd: usize) -> Swizzle {
    if hd == 128 {
        Swizzle::B128
    } else {
        Swizzle::B64
    }
}

/// Token-major codes `(tokens, heads, hd)`: box = `rows` tokens of one head, the swizzle of the
/// row width (`hd` = 64 or 128 bytes).
pub fn token_major(ptr: u64, tokens: usize, heads: usize, hd: usize, rows: u32) -> GpuResult<TmaMap> {
    let hd = hd as u64;
    encode(
        ptr,
        Elem::U8,
        &[hd, heads as u64, tokens as u64],
        &[hd, heads as u64 * hd],
        &[hd as u32, 1, rows],
        token_swizzle(hd as usize),
    )
}

/// Dim-major codes `(heads * hd, tpad)`: box = 128 tokens x the `hd` dim rows of one head,
/// 128-byte swizzle.
pub fn dim_major(ptr: u64, heads: usize, hd: usize, tpad: usize) -> GpuResult<TmaMap> {
    encode_u8(
        ptr,
        &[tpad as u64, (heads * hd) as u64],
        &[tpad as u64],
        &[128, hd as u32],
    )
}

/// Dim-major codes `(heads * hd, tpad)` with the 64-byte swizzle: box = 64 tokens x the `hd` dim
/// rows of one head (the backward's dim-major Q and dO steps).
pub fn dim_major_64(ptr: u64, heads: usize, hd: usize, tpad: usize) -> GpuResult<TmaMap> {
    encode(
        ptr,
        Elem::U8,
        &[tpad as u64, (heads * hd) as u64],
        &[tpad as u64],
        &[64, hd as u32],
        Swizzle::B64,
    )
}

/// FP32 rows `(tokens, heads, hd)`: box = 32 values x `rows` tokens of one head, 128-byte
/// swizzle (the backward's dQ partial tiles, added with a bulk tensor reduction).
pub fn f32_rows(ptr: u64, tokens: usize, heads: usize, hd: usize, rows: u32) -> GpuResult<TmaMap> {
    value_rows(ptr, Elem::F32, tokens, heads, hd, rows)
}

/// BF16 rows `(tokens, heads, hd)`: box = 64 values x `rows` tokens of one head, 128-byte
/// swizzle (the forward's O tiles, bulk-stored: `FWD_O_TMA`).
pub fn bf16_rows(ptr: u64, tokens: usize, heads: usize, hd: usize, rows: u32) -> GpuResult<TmaMap> {
    value_rows(ptr, Elem::Bf16, tokens, heads, hd, rows)
}

/// Rows of `elem` values `(tokens, heads, hd)`, boxes of one 128-byte swizzle span x `rows`.
fn value_rows(ptr: u64, elem: Elem, tokens: usize, heads: usize, hd: usize, rows: u32) -> GpuResult<TmaMap> {
    let row = elem.bytes() * hd as u64;
    encode(
        ptr,
        elem,
        &[hd as u64, heads as u64, tokens as u64],
        &[row, heads as u64 * row],
        &[(Swizzle::B128.span() / elem.bytes()) as u32, 1, rows],
        Swizzle::B128,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_maps_are_typed_errors_before_the_driver() {
        // innermost box not one swizzle span
        assert!(matches!(
            encode_u8(0, &[64, 4], &[64], &[64, 4]),
            Err(GpuError::NotSupported(_))
        ));
        // stride not a multiple of 16
        assert!(matches!(
            encode_u8(0, &[128, 4], &[120], &[128, 4]),
            Err(GpuError::NotSupported(_))
        ));
        // misaligned address
        assert!(matches!(
            encode_u8(8, &[128, 4], &[128], &[128, 4]),
            Err(GpuError::NotSupported(_))
        ));
        // FP32 box of 64 values with the 128-byte swizzle: 256 bytes, not the span
        assert!(matches!(
            encode(0, Elem::F32, &[128, 4], &[512], &[64, 4], Swizzle::B128),
            Err(GpuError::NotSupported(_))
        ));
        // 64-byte swizzle with a 128-byte box
        assert!(matches!(
            encode(0, Elem::U8, &[256, 4], &[256], &[128, 4], Swizzle::B64),
            Err(GpuError::NotSupported(_))
        ));
        // rank mismatch
        assert!(matches!(
            encode_u8(0, &[128, 4, 2], &[128], &[128, 4, 1]),
            Err(GpuError::NotSupported(_))
        ));
    }

    #[test]
    fn tma_map_matches_the_kernel_struct() {
        assert_eq!(std::mem::size_of::<TmaMap>(), 128);
        assert_eq!(std::mem::align_of::<TmaMap>(), 64);
    }
}
