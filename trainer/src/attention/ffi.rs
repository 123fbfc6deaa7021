//! The C ABI shared with `csrc/bridge.cpp` (keep the structs identical) and the Rust callbacks
//! the bridge calls for every path that is not libtorch's own flash attention.
//!
//! Layouts: q `(tokens, heads_q, head_dim)`, k/v `(tokens, heads_kv, head_dim)`, o like q,
//! lse `(heads_q, tokens)` f32. CPU pointers are f32 host memory; CUDA pointers are BF16 device
//! memory (lse f32). On CUDA the forward also gets `saved`, a device buffer (a libtorch uint8
//! tensor of the size [`saved_bytes_cb`] gave) that it quantises Q, K, V into; the backward gets
//! the same buffer and no q, k, v.

use std::ffi::{c_char, c_void};
use std::sync::Once;

use flamia_kernels::{AttnOptions, AttnPath, Precision, VarlenShape};

/// Opaque libtorch tensor (`at::Tensor`), the same type torch-sys calls `C_tensor`.
pub(crate) type CTensor = torch_sys::C_tensor;

/// Options of one call; mirrors `FlamiaParams` in bridge.cpp.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub(crate) struct FlamiaParams {
    pub path: i32,
    pub per_token_scales: u8,
    pub row_ds_exponents: u8,
    pub causal_dq_scaling: u8,
    pub hadamard: u8,
    pub causal: u8,
    pub pad: [u8; 3],
    pub softmax_scale: f32,
    pub max_seqlen: i64,
}

/// One forward or backward call; mirrors `FlamiaCall` in bridge.cpp.
#[repr(C)]
#[derive(Debug)]
pub(crate) struct FlamiaCall {
    pub params: FlamiaParams,
    pub tokens: i64,
    pub heads_q: i64,
    pub heads_kv: i64,
    pub head_dim: i64,
    pub n_docs: i64,
    pub cu_seqlens_host: *const i32,
    pub cu_seqlens_dev: *const i32,
    pub device: i32,
    pub is_backward: i32,
    pub stream: *mut c_void,
    pub q: *const c_void,
    pub k: *const c_void,
    pub v: *const c_void,
    pub o: *mut c_void,
    pub lse: *mut c_void,
    pub d_o: *const c_void,
    pub dq: *mut c_void,
    pub dk: *mut c_void,
    pub dv: *mut c_void,
    pub saved: *mut c_void,
    pub saved_bytes: i64,
}

type Callback = unsafe extern "C" fn(*const FlamiaCall, *mut c_char, usize) -> i32;
type Sizer = unsafe extern "C" fn(*const FlamiaCall, *mut i64, *mut c_char, usize) -> i32;
type Timer = unsafe extern "C" fn(*const FlamiaCall, i32);

extern "C" {
    fn flamia_bridge_register(forward: Callback, backward: Callback, saved_bytes: Sizer, timer: Timer);
    pub(crate) fn flamia_bridge_attention(
        q: *const CTensor,
        k: *const CTensor,
        v: *const CTensor,
        cu_host: *const CTensor,
        cu_dev: *const CTensor,
        params: *const FlamiaParams,
        out: *mut *mut CTensor,
        err: *mut c_char,
        err_len: usize,
    ) -> i32;
    fn flamia_bridge_has_cuda() -> i32;
    fn flamia_bridge_set_deterministic(on: i32, fill: i32, err: *mut c_char, err_len: usize) -> i32;
    fn flamia_bridge_deterministic() -> i32;
    fn flamia_bridge_fill_uninitialized() -> i32;
    fn flamia_bridge_checksum(t: *const CTensor, out: *mut i64, err: *mut c_char, err_len: usize) -> i32;
    fn flamia_bridge_pin_memory(
        t: *const CTensor,
        out: *mut *mut CTensor,
        err: *mut c_char,
        err_len: usize,
    ) -> i32;
    fn flamia_bridge_is_pinned(t: *const CTensor, err: *mut c_char, err_len: usize) -> i32;
    fn flamia_bridge_release_unsaved_inputs(
        q: *const CTensor,
        k: *const CTensor,
        v: *const CTensor,
        path: i32,
        released: *mut i64,
        err: *mut c_char,
        err_len: usize,
    ) -> i32;
}

fn bridge_error(err: &[c_char]) -> String {
    // SAFETY: the bridge wrote a NUL-terminated message into err (the buffer ends in a NUL).
    unsafe { std::ffi::CStr::from_ptr(err.as_ptr()) }
        .to_string_lossy()
        .into_owned()
}

/// Turns libtorch's deterministic mode on or off and its NaN fill of uninitialised memory
/// (see `flamia_bridge_set_deterministic`).
pub(crate) fn set_deterministic(on: bool, fill: bool) -> Result<(), String> {
    let mut err = [0 as c_char; 1024];
    // SAFETY: err is a writable buffer of err.len() bytes.
    let rc = unsafe { flamia_bridge_set_deterministic(on as i32, fill as i32, err.as_mut_ptr(), err.len()) };
    if rc == 0 {
        Ok(())
    } else {
        Err(bridge_error(&err))
    }
}

/// Whether libtorch's deterministic algorithms are on (not warn-only).
pub(crate) fn deterministic() -> bool {
    // SAFETY: a plain query without arguments.
    unsafe { flamia_bridge_deterministic() != 0 }
}

/// Whether libtorch's NaN fill of uninitialised memory (in deterministic mode) is on.
pub(crate) fn fill_uninitialized() -> bool {
    // SAFETY: a plain query without arguments.
    unsafe { flamia_bridge_fill_uninitialized() != 0 }
}

/// A pinned host copy of the CPU tensor `t` (see `flamia_bridge_pin_memory`: libtorch's
/// `pin_memory()` without the device argument it deprecates).
pub(crate) fn pin_memory(t: &tch::Tensor) -> Result<tch::Tensor, String> {
    let mut out: *mut CTensor = std::ptr::null_mut();
    let mut err = [0 as c_char; 1024];
    // SAFETY: `t` is a live tensor; on success the bridge stores a new heap at::Tensor in `out`.
    let rc = unsafe { flamia_bridge_pin_memory(t.as_ptr(), &mut out, err.as_mut_ptr(), err.len()) };
    if rc != 0 || out.is_null() {
        return Err(bridge_error(&err));
    }
    // SAFETY: `out` is a fresh `new at::Tensor` from the bridge, owned from here on.
    Ok(unsafe { tch::Tensor::from_ptr(out) })
}

/// Whether `t`'s memory is pinned (libtorch's `is_pinned()` without a device argument).
pub(crate) fn is_pinned(t: &tch::Tensor) -> Result<bool, String> {
    let mut err = [0 as c_char; 1024];
    // SAFETY: `t` is a live tensor; err is writable.
    match unsafe { flamia_bridge_is_pinned(t.as_ptr(), err.as_mut_ptr(), err.len()) } {
        0 => Ok(false),
        1 => Ok(true),
        _ => Err(bridge_error(&err)),
    }
}

/// The bit checksums of `t` (see `bits_checksum` in bridge.cpp).
pub(crate) fn checksum(t: &tch::Tensor) -> Result<[i64; 2], String> {
    let mut out = [0i64; 2];
    let mut err = [0 as c_char; 1024];
    // SAFETY: `t` is a live tensor; out holds two i64; err is writable.
    let rc = unsafe { flamia_bridge_checksum(t.as_ptr(), out.as_mut_ptr(), err.as_mut_ptr(), err.len()) };
    if rc == 0 {
        Ok(out)
    } else {
        Err(bridge_error(&err))
    }
}

/// Frees the storage of q, k, v where an attention call on `path` does not keep them for its
/// backward (see `flamia_bridge_release_unsaved_inputs`); the bytes freed.
pub(crate) fn release_unsaved_inputs(
    q: &tch::Tensor,
    k: &tch::Tensor,
    v: &tch::Tensor,
    path: AttnPath,
) -> Result<u64, String> {
    let mut released = 0i64;
    let mut err = [0 as c_char; 1024];
    // SAFETY: q, k, v are live tensors; released is one i64; err is writable.
    let rc = unsafe {
        flamia_bridge_release_unsaved_inputs(
            q.as_ptr(),
            k.as_ptr(),
            v.as_ptr(),
            path_code(path),
            &mut released,
            err.as_mut_ptr(),
            err.len(),
        )
    };
    if rc == 0 {
        Ok(released as u64)
    } else {
        Err(bridge_error(&err))
    }
}

/// Whether the bridge was compiled against a CUDA build of libtorch.
pub fn bridge_has_cuda() -> bool {
    // SAFETY: a plain query without arguments.
    unsafe { flamia_bridge_has_cuda() != 0 }
}

/// Registers the Rust callbacks with the bridge (once per process).
pub(crate) fn ensure_registered() {
    static ONCE: Once = Once::new();
    // SAFETY: the callbacks have the C signatures bridge.cpp expects and live for the program.
    ONCE.call_once(|| unsafe { flamia_bridge_register(forward_cb, backward_cb, saved_bytes_cb, timer_cb) });
}

pub(crate) fn path_code(path: AttnPath) -> i32 {
    match path {
        AttnPath::Exact => 0,
        AttnPath::Mxfp8 => 1,
        AttnPath::Nvfp4 => 2,
        AttnPath::LeakyFp8 => 3,
    }
}

fn path_from_code(code: i32) -> Result<AttnPath, String> {
    match code {
        0 => Ok(AttnPath::Exact),
        1 => Ok(AttnPath::Mxfp8),
        2 => Ok(AttnPath::Nvfp4),
        3 => Ok(AttnPath::LeakyFp8),
        c => Err(format!("unknown attention path code {c}; allowed 0..=3")),
    }
}

impl FlamiaCall {
    /// The attention options and packed shape this call describes.
    pub(crate) fn decode(&self) -> Result<(AttnOptions, VarlenShape), String> {
        let p = &self.params;
        let opts = AttnOptions {
            path: path_from_code(p.path)?,
            precision: Precision {
                per_token_scales: p.per_token_scales != 0,
                row_ds_exponents: p.row_ds_exponents != 0,
                causal_dq_scaling: p.causal_dq_scaling != 0,
                hadamard: p.hadamard != 0,
            },
            causal: p.causal != 0,
            softmax_scale: Some(p.softmax_scale),
        };
        if self.n_docs < 1 || self.cu_seqlens_host.is_null() {
            return Err(format!(
                "cu_seqlens must hold at least one document (got {} documents)",
                self.n_docs
            ));
        }
        // SAFETY: bridge.cpp passes a live int32 host tensor of n_docs + 1 entries.
        let cu = unsafe { std::slice::from_raw_parts(self.cu_seqlens_host, self.n_docs as usize + 1) };
        if let Some((i, c)) = cu.iter().enumerate().find(|(_, c)| **c < 0) {
            return Err(format!("cu_seqlens entry {i} is {c}: offsets are never negative"));
        }
        let cu: Vec<usize> = cu.iter().map(|&c| c as usize).collect();
        let shape = VarlenShape::new(
            cu,
            self.heads_q as usize,
            self.heads_kv as usize,
            self.head_dim as usize,
        )
        .map_err(|e| e.to_string())?;
        shape
            .check_tokens(self.tokens as usize)
            .map_err(|e| e.to_string())?;
        Ok((opts, shape))
    }
}

fn write_err(err: *mut c_char, len: usize, msg: &str) {
    if err.is_null() || len == 0 {
        return;
    }
    let bytes = msg.as_bytes();
    let n = bytes.len().min(len - 1);
    // SAFETY: err points to `len` writable bytes (a stack buffer in bridge.cpp).
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), err as *mut u8, n);
        *err.add(n) = 0;
    }
}

/// Nanoseconds spent in attention forward/backward calls (all paths, all threads, since start).
pub(crate) static CALLBACK_NANOS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Synchronise the CUDA stream around each timed attention call (accurate GPU attention time at
/// the cost of two syncs per call). Off by default.
pub(crate) static PROFILE_CUDA: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

thread_local! {
    static SPAN_START: std::cell::Cell<Option<std::time::Instant>> = const { std::cell::Cell::new(None) };
}

unsafe extern "C" fn timer_cb(call: *const FlamiaCall, begin: i32) {
    // SAFETY: bridge.cpp passes a live FlamiaCall.
    let call = unsafe { &*call };
    if call.device >= 0 && PROFILE_CUDA.load(std::sync::atomic::Ordering::Relaxed) {
        // SAFETY: libtorch's current stream handle (null = legacy default stream).
        let _ = unsafe { cudarc::driver::result::stream::synchronize(call.stream as _) };
    }
    let now = std::time::Instant::now();
    if begin != 0 {
        SPAN_START.with(|s| s.set(Some(now)));
    } else if let Some(t0) = SPAN_START.with(|s| s.take()) {
        CALLBACK_NANOS.fetch_add((now - t0).as_nanos() as u64, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Runs `f` on the call behind `call`, turning an error or a panic into a message in `err`.
fn guarded<R>(
    call: *const FlamiaCall,
    err: *mut c_char,
    err_len: usize,
    f: impl FnOnce(&FlamiaCall) -> Result<R, String> + std::panic::UnwindSafe,
) -> Option<R> {
    let result = std::panic::catch_unwind(|| {
        // SAFETY: bridge.cpp passes a pointer to a live FlamiaCall for the duration of the call.
        f(unsafe { &*call })
    });
    match result {
        Ok(Ok(r)) => Some(r),
        Ok(Err(msg)) => {
            write_err(err, err_len, &msg);
            None
        }
        Err(_) => {
            write_err(err, err_len, "panic in the Rust attention callback");
            None
        }
    }
}

fn run_callback(call: *const FlamiaCall, err: *mut c_char, err_len: usize, backward: bool) -> i32 {
    let run = |call: &FlamiaCall| {
        if call.device < 0 {
            super::cpu::run(call, backward)
        } else {
            super::gpu::run(call, backward)
        }
    };
    match guarded(call, err, err_len, run) {
        Some(()) => 0,
        None => 1,
    }
}

/// Bytes of the quantised-operand buffer of a CUDA call (bridge.cpp allocates it per forward).
unsafe extern "C" fn saved_bytes_cb(
    call: *const FlamiaCall,
    bytes: *mut i64,
    err: *mut c_char,
    err_len: usize,
) -> i32 {
    match guarded(call, err, err_len, super::gpu::saved_bytes) {
        Some(n) => {
            // SAFETY: bridge.cpp passes a pointer to an int64_t on its stack.
            unsafe { *bytes = n as i64 };
            0
        }
        None => 1,
    }
}

unsafe extern "C" fn forward_cb(call: *const FlamiaCall, err: *mut c_char, err_len: usize) -> i32 {
    run_callback(call, err, err_len, false)
}

unsafe extern "C" fn backward_cb(call: *const FlamiaCall, err: *mut c_char, err_len: usize) -> i32 {
    run_callback(call, err, err_len, true)
}
