//! Host-tensor convenience: runs the GPU forward and backward of one [`AttnCall`] (its `f32` host
//! tensors rounded to BF16 on upload, every output poisoned with NaN first) and returns the CPU
//! reference's result types, so the GPU is checked with the reference's tools: [`attn_fn`] is the
//! GPU as the leakage harness's and the numerics check's [`crate::leakage::AttnFn`] (`flamia check
//! numerics --device cuda`, the GPU tests). Layouts as [`crate::reference`].

use super::attention::Attention;
use super::buffer::DeviceBuf;
use super::error::GpuResult;
use super::plan::Plan;
use super::runtime::{Gpu, RawStream};
use crate::call::AttnCall;
use crate::reference::{Forward, Grads};
use half::bf16;
use std::sync::Arc;

fn upload(gpu: &Gpu, x: &[f32]) -> GpuResult<DeviceBuf<u16>> {
    DeviceBuf::from_host(
        gpu,
        &x.iter()
            .map(|v| bf16::from_f32(*v).to_bits())
            .collect::<Vec<u16>>(),
    )
}

fn download(b: &DeviceBuf<u16>) -> GpuResult<Vec<f32>> {
    Ok(b.to_host()?
        .into_iter()
        .map(|v| bf16::from_bits(v).to_f32())
        .collect())
}

/// Forward + backward of `call` on the GPU (the legacy default stream), as
/// [`crate::reference::forward_backward`] on the CPU.
pub fn forward_backward(gpu: &Arc<Gpu>, call: &AttnCall) -> GpuResult<(Forward, Grads)> {
    let AttnCall {
        q,
        k,
        v,
        dout,
        shape,
        opts,
    } = call;
    let (t, hq, hkv, d) = (shape.tokens(), shape.heads_q, shape.heads_kv, shape.head_dim);
    crate::quant::check_len("q", q, t, hq, d)?;
    crate::quant::check_len("k", k, t, hkv, d)?;
    crate::quant::check_len("v", v, t, hkv, d)?;
    crate::quant::check_len("dout", dout, t, hq, d)?;
    let attn = Attention::new(gpu.clone(), *opts)?;
    let plan = Plan::new(gpu, shape, opts.causal)?;
    let (qd, kd, vd, gd) = (
        upload(gpu, q)?,
        upload(gpu, k)?,
        upload(gpu, v)?,
        upload(gpu, dout)?,
    );
    let nan16 = |n: usize| DeviceBuf::<u16>::from_host(gpu, &vec![0xFFFF; n]);
    let (o, dq, dk, dv) = (
        nan16(t * hq * d)?,
        nan16(t * hq * d)?,
        nan16(t * hkv * d)?,
        nan16(t * hkv * d)?,
    );
    let lse = DeviceBuf::<f32>::from_host(gpu, &vec![f32::NAN; t * hq])?;
    let s = RawStream(std::ptr::null_mut());
    let saved = attn.forward(s, &plan, qd.ptr(), kd.ptr(), vd.ptr(), o.ptr(), lse.ptr())?;
    attn.backward(
        s,
        &plan,
        &saved,
        o.ptr(),
        lse.ptr(),
        gd.ptr(),
        dq.ptr(),
        dk.ptr(),
        dv.ptr(),
    )?;
    let fwd = Forward {
        o: download(&o)?,
        lse: lse.to_host()?,
    };
    let grads = Grads {
        dq: download(&dq)?,
        dk: download(&dk)?,
        dv: download(&dv)?,
        ds_zero_fraction: f64::NAN,
    };
    Ok((fwd, grads))
}

/// The GPU as an attention function of the leakage harness and the numerics check: a GPU error
/// becomes [`crate::Error::Device`].
pub fn attn_fn(gpu: &Arc<Gpu>) -> impl Fn(&AttnCall) -> crate::Result<(Forward, Grads)> + Sync + '_ {
    move |call| forward_backward(gpu, call).map_err(|e| crate::Error::Device(e.to_string()))
}
