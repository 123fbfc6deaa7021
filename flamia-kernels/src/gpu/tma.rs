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

/// A tiled map of a byte tensor: `dims` innermost first (elements = bytes), `strides` in bytes of
/// dimensions 1.. (multiples of 16), `boxes` the box size per dimension; the innermost box must
/// be 128 bytes (one swizzle span). Out-of-range box elements read as zero.
pub fn encode_u8(ptr: u64, dims: &[u64], strides: &[u64], boxes: &[u32]) -> GpuResult<TmaMap> {
    let rank = dims.len();
    let bad = |why: String| {
        GpuError::NotSupported(format!("TMA map {dims:?} / {strides:?} / box {boxes:?}: {why}"))
    };
    if !(2..=5).contains(&rank) || strides.len() + 1 != rank || boxes.len() != rank {
        return Err(bad("rank 2..5 with rank-1 strides and rank boxes".into()));
    }
    if boxes[0] != 128 || boxes.iter().any(|b| *b == 0 || *b > 256) {
        return Err(bad("innermost box must be 128 bytes, every box 1..=256".into()));
    }
    if !ptr.is_multiple_of(16) || strides.iter().any(|s| !s.is_multiple_of(16)) {
        return Err(bad("address and strides must be multiples of 16 bytes".into()));
    }
    let elem = vec![1u32; rank];
    let mut map = std::mem::MaybeUninit::<sys::CUtensorMap>::zeroed();
    // SAFETY: every array has `rank` (strides: rank - 1) entries as the driver requires; `map` is
    // writable and aligned (CUtensorMap's own alignment).
    unsafe {
        sys::cuTensorMapEncodeTiled(
            map.as_mut_ptr(),
            sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_UINT8,
            rank as u32,
            ptr as *mut std::ffi::c_void,
            dims.as_ptr(),
            strides.as_ptr(),
            boxes.as_ptr(),
            elem.as_ptr(),
            sys::CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
            sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B,
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

/// Token-major codes `(tokens, heads, 128)`: box = `rows` tokens of one head.
pub fn token_major(ptr: u64, tokens: usize, heads: usize, rows: u32) -> GpuResult<TmaMap> {
    encode_u8(
        ptr,
        &[128, heads as u64, tokens as u64],
        &[128, heads as u64 * 128],
        &[128, 1, rows],
    )
}

/// Dim-major codes `(heads * 128, tpad)`: box = 128 tokens x `rows` head-dim rows.
pub fn dim_major(ptr: u64, heads: usize, tpad: usize, rows: u32) -> GpuResult<TmaMap> {
    encode_u8(
        ptr,
        &[tpad as u64, heads as u64 * 128],
        &[tpad as u64],
        &[128, rows],
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
