//! Attention through the bridge: a libtorch autograd Function (csrc/bridge.cpp) running FLAMIA
//! (Rust, `flamia-kernels`) or the exact control (libtorch flash attention on CUDA, the Rust
//! reference on CPU).
//!
//! Layouts: q `(tokens, heads_q, head_dim)`, k/v `(tokens, heads_kv, head_dim)`, all rows of a
//! batch packed into one sequence and split into documents by `cu_seqlens`; the result is like q.

mod cpu;
pub mod exact;
mod ffi;
mod gpu;

use std::ffi::c_char;

use flamia_kernels::{AttnOptions, AttnPath};
use tch::{Device, Kind, Tensor};

use crate::error::{Result, TrainError};
pub use ffi::bridge_has_cuda;

/// Turns on stream synchronisation around every CUDA attention call so [`callback_seconds`]
/// measures GPU attention time (two syncs per call; CPU paths are always timed exactly).
pub fn set_profile_cuda(on: bool) {
    ffi::PROFILE_CUDA.store(on, std::sync::atomic::Ordering::Relaxed);
}

/// Turns libtorch's deterministic mode on or off for the whole process: deterministic algorithms
/// (an error from any operation that has none; libtorch's flash-attention backward, the `bf16`
/// control, switches to its deterministic variant), deterministic cuDNN without benchmarking;
/// `fill`: libtorch's NaN fill of every uninitialised tensor it allocates in the mode.
/// On CUDA, `CUBLAS_WORKSPACE_CONFIG` must be set before cuBLAS starts
/// ([`crate::determinism::apply`] does both).
pub fn set_deterministic(on: bool, fill: bool) -> Result<()> {
    ffi::set_deterministic(on, fill).map_err(TrainError::Attention)
}

/// Whether libtorch's deterministic algorithms are on (not warn-only).
pub fn deterministic() -> bool {
    ffi::deterministic()
}

/// Whether libtorch fills uninitialised memory with NaN in deterministic mode.
pub fn fill_uninitialized() -> bool {
    ffi::fill_uninitialized()
}

/// Exact checksums of a tensor's bits on its own device: the sum and an index-weighted sum of
/// its elements read as integers (wrapping int64 sums, so independent of the reduction order).
/// Equal tensors give equal pairs; the same pair `FLAMIA_TRACE_CHECKSUMS` writes per attention
/// call. Synchronises with the device.
pub fn checksum(t: &Tensor) -> Result<[i64; 2]> {
    ffi::checksum(t).map_err(TrainError::Attention)
}

/// Frees the memory of `q`, `k` and `v` after an [`attention`] call on them where that call does
/// not keep them for its backward (CUDA and a FLAMIA path: the backward reads the forward's own
/// FP8 codes); their sizes and autograd metadata stay, so leaves among them still receive their
/// gradients. For a caller that keeps q, k, v only to read their gradients (selective activation
/// checkpointing): nothing may read their values afterwards. Exact attention on CUDA and every
/// CPU path keep them (nothing is freed). Returns the bytes freed (a storage shared by several of
/// them counts once).
pub fn release_unsaved_inputs(q: &Tensor, k: &Tensor, v: &Tensor, opts: &AttnOptions) -> Result<u64> {
    ffi::release_unsaved_inputs(q, k, v, opts.path).map_err(TrainError::Attention)
}

/// A pinned (page-locked) host copy of the CPU tensor `t`, from libtorch's caching host
/// allocator. Unlike tch's `pin_memory(device)`, it does not pass the device argument libtorch
/// 2.11 deprecates (a warning line on every call). Needs a CUDA device. Errors are libtorch's
/// (`TrainError::Tch`, as tch's own `pin_memory` gave them, so a host out-of-memory reads the
/// same), not the attention bridge's.
pub fn pinned_copy(t: &Tensor) -> Result<Tensor> {
    ffi::pin_memory(t).map_err(|e| TrainError::Tch(tch::TchError::Torch(e)))
}

/// Whether `t`'s memory is pinned (without libtorch's deprecated device argument).
pub fn is_pinned(t: &Tensor) -> Result<bool> {
    ffi::is_pinned(t).map_err(|e| TrainError::Tch(tch::TchError::Torch(e)))
}

/// `t` (a CPU tensor) on `device` as `kind`: on CUDA converted on the host first, then through a
/// [`pinned_copy`] and a non-blocking upload, so the copy does not wait for the whole stream (a
/// plain `to_device` of pageable memory does; libtorch's host caching allocator keeps the pinned
/// block until the copy has run); elsewhere a plain `to_device` (on the CPU, `t` itself where
/// `kind` is its own).
pub fn upload(t: &Tensor, kind: Kind, device: Device) -> Result<Tensor> {
    match device {
        Device::Cuda(_) => {
            // (a conversion inside the copy would go through a pageable temporary)
            let host = if t.kind() == kind {
                t.shallow_clone()
            } else {
                t.f_to_kind(kind)?
            };
            Ok(pinned_copy(&host)?.f_to_device_(device, kind, true, false)?)
        }
        _ => Ok(t.f_to_device_(device, kind, false, false)?),
    }
}

/// Seconds spent so far inside attention forward/backward calls of every path (on CUDA only
/// meaningful with [`set_profile_cuda`], since kernels run asynchronously).
pub fn callback_seconds() -> f64 {
    ffi::CALLBACK_NANOS.load(std::sync::atomic::Ordering::Relaxed) as f64 * 1e-9
}

/// Document boundaries of a packed batch, on the host and on the compute device.
#[derive(Debug)]
pub struct Packing {
    cu_host: Tensor,
    cu_dev: Tensor,
    max_seqlen: i64,
    tokens: usize,
}

impl Packing {
    /// From `cu_seqlens` (`[0, ..., tokens]`, strictly increasing).
    pub fn new(cu_seqlens: &[usize], device: Device) -> Result<Packing> {
        if cu_seqlens.len() < 2 || cu_seqlens[0] != 0 || cu_seqlens.windows(2).any(|w| w[1] <= w[0]) {
            return Err(TrainError::Invalid(format!(
                "cu_seqlens must start at 0 and strictly increase with at least one document; got {cu_seqlens:?}"
            )));
        }
        let tokens = cu_seqlens[cu_seqlens.len() - 1];
        if tokens > i32::MAX as usize {
            return Err(TrainError::Invalid(format!(
                "{tokens} tokens in one packing; attention takes at most {} (int32 offsets)",
                i32::MAX
            )));
        }
        let cu: Vec<i32> = cu_seqlens.iter().map(|&c| c as i32).collect();
        let cu_host = Tensor::from_slice(&cu);
        // On CUDA a pinned staging copy and a non-blocking upload (`upload`), so building a
        // packing never drains the stream; `cu_host` stays pageable for the bridge's host-side
        // reads.
        let cu_dev = upload(&cu_host, Kind::Int, device)?;
        let max_seqlen = cu_seqlens.windows(2).map(|w| w[1] - w[0]).max().unwrap_or(0) as i64;
        Ok(Packing {
            cu_host,
            cu_dev,
            max_seqlen,
            tokens: *cu_seqlens.last().unwrap_or(&0),
        })
    }

    /// Total tokens.
    pub fn tokens(&self) -> usize {
        self.tokens
    }

    /// Longest document.
    pub fn max_seqlen(&self) -> i64 {
        self.max_seqlen
    }
}

/// Parses an attention path name as configs spell it: `bf16` (the exact control; `exact` is
/// accepted too), `mxfp8`, `nvfp4`, `leaky-fp8`.
pub fn parse_path(s: &str) -> Result<AttnPath> {
    match s {
        "bf16" | "exact" => Ok(AttnPath::Exact),
        "mxfp8" => Ok(AttnPath::Mxfp8),
        "nvfp4" => Ok(AttnPath::Nvfp4),
        "leaky-fp8" => Ok(AttnPath::LeakyFp8),
        other => Err(TrainError::Invalid(format!(
            "unknown attention path {other:?}; allowed: bf16, mxfp8, nvfp4, leaky-fp8"
        ))),
    }
}

/// The config name of a path (`bf16` for the exact control).
pub fn path_name(p: AttnPath) -> &'static str {
    match p {
        AttnPath::Exact => "bf16",
        other => other.name(),
    }
}

/// Causal-or-not attention of packed documents through the bridge; differentiable in q, k, v.
pub fn attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    packing: &Packing,
    opts: &AttnOptions,
) -> Result<Tensor> {
    let (tq, hq, d) = q.size3()?;
    let (tk, hkv, dk) = k.size3()?;
    if tq as usize != packing.tokens || tk != tq || v.size() != k.size() || dk != d {
        return Err(TrainError::Invalid(format!(
            "attention shapes: q {:?}, k {:?}, v {:?} must be (tokens, heads, head_dim) with {} tokens",
            q.size(),
            k.size(),
            v.size(),
            packing.tokens
        )));
    }
    if hkv == 0 || hq % hkv != 0 {
        return Err(TrainError::Invalid(format!(
            "query heads {hq} must be a multiple of KV heads {hkv}"
        )));
    }
    if q.device() == Device::Cpu && q.kind() != Kind::Float {
        return Err(TrainError::Invalid(format!(
            "CPU attention takes float32 tensors, got {:?}",
            q.kind()
        )));
    }
    ffi::ensure_registered();
    let p = opts.precision;
    let params = ffi::FlamiaParams {
        path: ffi::path_code(opts.path),
        per_token_scales: p.per_token_scales as u8,
        row_ds_exponents: p.row_ds_exponents as u8,
        causal_dq_scaling: p.causal_dq_scaling as u8,
        hadamard: p.hadamard as u8,
        causal: opts.causal as u8,
        pad: [0; 3],
        softmax_scale: opts.scale(d as usize),
        max_seqlen: packing.max_seqlen,
    };
    let mut out: *mut ffi::CTensor = std::ptr::null_mut();
    let mut err = [0 as c_char; 2048];
    // SAFETY: all tensor pointers are live tch tensors; the bridge only reads them and returns a
    // new heap at::Tensor in `out` on success, which `Tensor::from_ptr` takes ownership of.
    let rc = unsafe {
        ffi::flamia_bridge_attention(
            q.as_ptr(),
            k.as_ptr(),
            v.as_ptr(),
            packing.cu_host.as_ptr(),
            packing.cu_dev.as_ptr(),
            &params,
            &mut out,
            err.as_mut_ptr(),
            err.len(),
        )
    };
    if rc != 0 || out.is_null() {
        // SAFETY: the bridge wrote a NUL-terminated message into err.
        let msg = unsafe { std::ffi::CStr::from_ptr(err.as_ptr()) }
            .to_string_lossy()
            .into_owned();
        return Err(TrainError::Attention(msg));
    }
    // SAFETY: `out` is a fresh `new at::Tensor` from the bridge.
    Ok(unsafe { Tensor::from_ptr(out) })
}
