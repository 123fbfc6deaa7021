//! CPU side of the bridge: f32 host tensors. The FLAMIA paths run `flamia_kernels::reference`
//! (the numerical specification); the exact control runs [`super::exact`] (f64 accumulation,
//! the same numbers as the reference's `exact` path up to f32 rounding, and simpler/faster).
//!
//! Layouts as in [`super::ffi`]: q/o `(tokens, heads_q, head_dim)`, k/v `(tokens, heads_kv,
//! head_dim)`, lse `(heads_q, tokens)` in the bridge (the reference's `(tokens, heads_q)` is
//! transposed on the way in and out).

use super::ffi::FlamiaCall;
use flamia_kernels::{reference, AttnPath};

fn transpose(src: &[f32], rows: usize, cols: usize, dst: &mut [f32]) {
    for r in 0..rows {
        for c in 0..cols {
            dst[c * rows + r] = src[r * cols + c];
        }
    }
}

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
            _ => {
                let f = reference::forward(q, k, v, &shape, &opts).map_err(|e| e.to_string())?;
                o.copy_from_slice(&f.o);
                transpose(&f.lse, t, shape.heads_q, lse);
                Ok(())
            }
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
        _ => {
            let mut lse_th = vec![0f32; nl];
            transpose(lse, shape.heads_q, t, &mut lse_th);
            let g =
                reference::backward(q, k, v, o, &lse_th, d_o, &shape, &opts).map_err(|e| e.to_string())?;
            dq.copy_from_slice(&g.dq);
            dk.copy_from_slice(&g.dk);
            dv.copy_from_slice(&g.dv);
            Ok(())
        }
    }
}
