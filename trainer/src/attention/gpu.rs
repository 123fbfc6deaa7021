//! CUDA side of the bridge for the FLAMIA paths: BF16 device tensors handed to
//! `flamia_kernels::gpu` on libtorch's current stream. (The `bf16` control never gets here:
//! bridge.cpp calls libtorch's flash attention for it.)
//!
//! The forward quantises Q, K, V and returns O and LSE; the backward quantises Q, K, V again from
//! the same BF16 inputs (the quantiser is deterministic, so these are the forward's codes bit for
//! bit: forward/backward consistency without keeping Rust state across the autograd graph) and
//! runs the backward kernels. Each callback waits for its stream before returning because the
//! scratch buffers it allocated are freed on return.
//!
//! Layouts: q/o/dq `(tokens, heads_q, head_dim)`, k/v/dk/dv `(tokens, heads_kv, head_dim)` BF16;
//! lse an f32 buffer of `tokens * heads_q` whose layout only the kernels read.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use flamia_kernels::gpu::{Attention, Gpu, Plan, RawStream};
use flamia_kernels::AttnOptions;

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

/// Runs the forward (o, lse) or backward (dq, dk, dv) of one CUDA call.
pub(crate) fn run(call: &FlamiaCall, backward: bool) -> Result<(), String> {
    let (opts, shape) = call.decode()?;
    let attn = attention_for(call.device as usize, &opts, shape.head_dim)?;
    let gpu_plan_gpu = attn.gpu().clone();
    let plan = Plan::new(&gpu_plan_gpu, &shape, opts.causal).map_err(|e| e.to_string())?;
    let stream = RawStream(call.stream as _);
    let p = |x: *const std::ffi::c_void| x as u64;
    if !backward {
        let saved = attn
            .forward(
                stream,
                &plan,
                p(call.q),
                p(call.k),
                p(call.v),
                p(call.o),
                p(call.lse),
            )
            .map_err(|e| e.to_string())?;
        sync(stream)?;
        drop(saved);
        return Ok(());
    }
    let saved = attn.alloc_saved(&plan).map_err(|e| e.to_string())?;
    attn.quantize_inputs(stream, &plan, p(call.q), p(call.k), p(call.v), &saved)
        .map_err(|e| e.to_string())?;
    attn.backward(
        stream,
        &plan,
        &saved,
        p(call.o),
        p(call.lse),
        p(call.d_o),
        p(call.dq),
        p(call.dk),
        p(call.dv),
    )
    .map_err(|e| e.to_string())?;
    sync(stream)
}
