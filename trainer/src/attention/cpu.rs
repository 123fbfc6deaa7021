//! CPU side of the bridge: f32 host tensors, every path on the Rust reference.
//!
//! Layouts as in [`super::ffi`]: q/o `(tokens, heads_q, head_dim)`, k/v `(tokens, heads_kv,
//! head_dim)`, lse `(heads_q, tokens)`.

use super::ffi::FlamiaCall;
use flamia_kernels::AttnPath;

/// Runs the forward (writes o, lse) or backward (writes dq, dk, dv) of one call.
pub(crate) fn run(call: &FlamiaCall, backward: bool) -> Result<(), String> {
    let (opts, shape) = call.decode()?;
    let t = shape.tokens();
    let nq = t * shape.heads_q * shape.head_dim;
    let nkv = t * shape.heads_kv * shape.head_dim;
    let nl = t * shape.heads_q;
    // SAFETY: bridge.cpp hands contiguous f32 CPU tensors of exactly these sizes, alive for the
    // call; outputs are distinct fresh tensors.
    let (q, k, v) = unsafe {
        (
            std::slice::from_raw_parts(call.q as *const f32, nq),
            std::slice::from_raw_parts(call.k as *const f32, nkv),
            std::slice::from_raw_parts(call.v as *const f32, nkv),
        )
    };
    if !backward {
        // SAFETY: as above.
        let (o, lse) = unsafe {
            (
                std::slice::from_raw_parts_mut(call.o as *mut f32, nq),
                std::slice::from_raw_parts_mut(call.lse as *mut f32, nl),
            )
        };
        return match opts.path {
            AttnPath::Exact => {
                super::exact::forward(q, k, v, &shape, &opts, o, lse);
                Ok(())
            }
            p => Err(missing_reference(p)),
        };
    }
    // SAFETY: as above.
    let (o, lse, d_o, dq, dk, dv) = unsafe {
        (
            std::slice::from_raw_parts(call.o as *const f32, nq),
            std::slice::from_raw_parts(call.lse as *const f32, nl),
            std::slice::from_raw_parts(call.d_o as *const f32, nq),
            std::slice::from_raw_parts_mut(call.dq as *mut f32, nq),
            std::slice::from_raw_parts_mut(call.dk as *mut f32, nkv),
            std::slice::from_raw_parts_mut(call.dv as *mut f32, nkv),
        )
    };
    match opts.path {
        AttnPath::Exact => {
            super::exact::backward(q, k, v, o, lse, d_o, &shape, &opts, dq, dk, dv);
            Ok(())
        }
        p => Err(missing_reference(p)),
    }
}

fn missing_reference(path: AttnPath) -> String {
    format!(
        "the CPU reference for the {path} path (flamia_kernels::reference) is not in this build; \
         on CPU only the bf16 control (exact) path runs"
    )
}
