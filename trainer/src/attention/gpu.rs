//! CUDA side of the bridge for the FLAMIA paths: BF16 device tensors handed to
//! `flamia_kernels::gpu` on libtorch's current stream. (The `bf16` control never gets here:
//! bridge.cpp calls libtorch's flash attention for it.)
//!
//! The forward quantises Q, K, V (one fused launch) into the call's own buffer, which bridge.cpp
//! allocates through libtorch ([`saved_bytes`] sizes it) and saves for the backward instead of
//! the BF16 q, k, v; it returns O and LSE. The backward reads the forward's codes and exponents
//! from that buffer (forward/backward consistency by construction, no second quantisation of
//! Q, K, V), quantises dO and runs the backward kernels. The plan and the dO buffers live in a
//! per-(options, stream) [`Workspace`] reused while the packing stays the same, so a callback
//! only queues kernels on the stream and returns (no host-device round trip per call; one per
//! new packing).
//!
//! Layouts: q/o/dq `(tokens, heads_q, head_dim)`, k/v/dk/dv `(tokens, heads_kv, head_dim)` BF16;
//! lse an f32 buffer of `tokens * heads_q` whose layout only the kernels read.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use flamia_kernels::gpu::{Attention, Gpu, GradWorkspace, Plan, RawStream};
use flamia_kernels::{AttnOptions, VarlenShape};

use super::ffi::FlamiaCall;

type Key = (usize, i32, [bool; 5], u32);

fn key(ordinal: usize, o: &AttnOptions, head_dim: usize) -> Key {
    let p = o.precision;
    (
        ordinal,
        super::ffi::path_code(o.path),
        [
            p.per_token_scales,
            p.row_ds_exponents,
            p.causal_dq_scaling,
            p.hadamard,
            o.causal,
        ],
        o.scale(head_dim).to_bits(),
    )
}

/// One `Gpu` per device and one `Attention` per option set, made on first use.
fn attention_for(ordinal: usize, opts: &AttnOptions, head_dim: usize) -> Result<Arc<Attention>, String> {
    static GPUS: OnceLock<Mutex<HashMap<usize, Arc<Gpu>>>> = OnceLock::new();
    static ATTN: OnceLock<Mutex<HashMap<Key, Arc<Attention>>>> = OnceLock::new();
    let k = key(ordinal, opts, head_dim);
    let mut attn = ATTN
        .get_or_init(Default::default)
        .lock()
        .map_err(|_| "attention cache poisoned")?;
    if let Some(a) = attn.get(&k) {
        return Ok(a.clone());
    }
    let gpu = {
        let mut gpus = GPUS
            .get_or_init(Default::default)
            .lock()
            .map_err(|_| "GPU cache poisoned")?;
        match gpus.get(&ordinal) {
            Some(g) => g.clone(),
            None => {
                let g = Gpu::new(ordinal).map_err(|e| e.to_string())?;
                gpus.insert(ordinal, g.clone());
                g
            }
        }
    };
    let a = Arc::new(Attention::new(gpu, *opts).map_err(|e| e.to_string())?);
    attn.insert(k, a.clone());
    Ok(a)
}

fn sync(stream: RawStream) -> Result<(), String> {
    // SAFETY: a live stream handle from libtorch (or the legacy default stream, null).
    unsafe { cudarc::driver::result::stream::synchronize(stream.0) }
        .map_err(|e| format!("cuStreamSynchronize: {e}"))
}

/// What the calls of one (option set, stream) reuse: the plan of the last packing (every layer
/// of a batch shares it, forward and backward) and the dO buffers sized for it (each backward
/// quantises its dO before reading it). All its users run on that one stream, so reusing it is
/// ordered by the stream and needs no synchronisation; only replacing it (a new packing) waits
/// for the stream first, because the old buffers are freed then. The quantised Q, K, V are not
/// here: every forward call has its own buffer, kept by autograd until its backward.
struct Workspace {
    plan: Plan,
    grad: GradWorkspace,
}

type WorkKey = (Key, usize);

fn with_workspace<R>(
    attn: &Attention,
    k: WorkKey,
    shape: &VarlenShape,
    stream: RawStream,
    f: impl FnOnce(&Workspace) -> Result<R, String>,
) -> Result<R, String> {
    static WORK: OnceLock<Mutex<HashMap<WorkKey, Workspace>>> = OnceLock::new();
    let mut work = WORK
        .get_or_init(Default::default)
        .lock()
        .map_err(|_| "attention workspace cache poisoned")?;
    if work.get(&k).is_some_and(|w| w.plan.shape() != shape) {
        sync(stream)?; // the stream may still read the old buffers
        work.remove(&k);
    }
    let w = match work.entry(k) {
        std::collections::hash_map::Entry::Occupied(o) => o.into_mut(),
        std::collections::hash_map::Entry::Vacant(v) => {
            let e = |e: flamia_kernels::gpu::GpuError| e.to_string();
            let plan = Plan::new(attn.gpu(), shape, attn.options().causal).map_err(e)?;
            let grad = attn.alloc_grad(&plan).map_err(e)?;
            v.insert(Workspace { plan, grad })
        }
    };
    f(w)
}

/// The attention of a call and its workspace key.
fn attention_of(call: &FlamiaCall) -> Result<(Arc<Attention>, WorkKey, VarlenShape), String> {
    let (opts, shape) = call.decode()?;
    let attn = attention_for(call.device as usize, &opts, shape.head_dim)?;
    let k = (
        key(call.device as usize, &opts, shape.head_dim),
        call.stream as usize,
    );
    Ok((attn, k, shape))
}

/// Bytes of the quantised Q, K, V buffer of a forward call (bridge.cpp allocates it).
pub(crate) fn saved_bytes(call: &FlamiaCall) -> Result<usize, String> {
    let (attn, k, shape) = attention_of(call)?;
    let stream = RawStream(call.stream as _);
    with_workspace(&attn, k, &shape, stream, |w| Ok(attn.saved_bytes(&w.plan)))
}

/// Runs the forward (quantises Q, K, V into `call.saved`; writes o, lse) or the backward (reads
/// `call.saved`; writes dq, dk, dv) of one CUDA call: launches on libtorch's stream and returns
/// without waiting for them.
pub(crate) fn run(call: &FlamiaCall, backward: bool) -> Result<(), String> {
    let (attn, k, shape) = attention_of(call)?;
    let stream = RawStream(call.stream as _);
    let p = |x: *const std::ffi::c_void| x as u64;
    with_workspace(&attn, k, &shape, stream, |w| {
        let e = |e: flamia_kernels::gpu::GpuError| e.to_string();
        let saved = attn
            .saved_in(&w.plan, p(call.saved), call.saved_bytes.max(0) as usize)
            .map_err(e)?;
        if !backward {
            attn.quantize_inputs(stream, &w.plan, p(call.q), p(call.k), p(call.v), &saved)
                .map_err(e)?;
            return attn
                .forward_quantized(stream, &w.plan, &saved, p(call.o), p(call.lse))
                .map_err(e);
        }
        attn.quantize_grad(stream, &w.plan, p(call.d_o), p(call.o), &w.grad)
            .map_err(e)?;
        attn.backward_quantized(
            stream,
            &w.plan,
            &saved,
            &w.grad,
            p(call.lse),
            p(call.dq),
            p(call.dk),
            p(call.dv),
        )
        .map_err(e)
    })
}
