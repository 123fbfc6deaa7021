//! Fused GPU quantisers (`cuda/quant.cu`): one launch per input tensor turns a BF16
//! `(tokens, heads, 128)` tensor into the E4M3 operand the attention kernels read, bit for bit
//! the CPU reference [`crate::quant::quantize_e4m3`] (after [`crate::hadamard`] for Q and K):
//! token-major codes `(tokens, heads, 128)`, dim-major codes `(heads, 128, Tpad)` (documents at
//! multiples of 64, zero padding) and the per-token exponent table `(tokens, heads)`.
//! For dO the same launch also writes `D_i = dO_hat_i . O_i` (FP32, `(tokens, heads)`).
//! [`quantize_nvfp4`] is the NVFP4 quantiser of Q/K (bit for bit [`crate::quant::quantize_nvfp4`]).

use super::buffer::DeviceBuf;
use super::error::{DriverContext, GpuResult};
use super::plan::Plan;
use super::runtime::{launch, Gpu, RawStream, Variant};
use crate::quant::ScaleMode;

/// An E4M3 operand in both layouts with its exponent table.
#[derive(Debug)]
pub struct Operand {
    /// `(tokens, heads, 128)` codes.
    pub tok: DeviceBuf<u8>,
    /// `(heads, 128, Tpad)` codes.
    pub dim: DeviceBuf<u8>,
    /// `(tokens, heads)` exponents.
    pub exps: DeviceBuf<i8>,
    pub heads: usize,
}

impl Operand {
    /// Allocates an operand of `heads` heads for `plan`.
    pub fn alloc(gpu: &Gpu, plan: &Plan, heads: usize) -> GpuResult<Operand> {
        let t = plan.shape().tokens();
        Ok(Operand {
            tok: DeviceBuf::zeros(gpu, t * heads * 128)?,
            dim: DeviceBuf::zeros(gpu, heads * 128 * plan.tpad())?,
            exps: DeviceBuf::zeros(gpu, t * heads)?,
            heads,
        })
    }
}

/// NVFP4 operand: E2M1 codes (low nibble), E4M3 group scales, per-token exponents, and the exact
/// values `e2m1 * scale` in BF16 that the emulated NVFP4 score product reads.
#[derive(Debug)]
pub struct Nvfp4Operand {
    pub codes: DeviceBuf<u8>,
    pub scales: DeviceBuf<u8>,
    pub exps: DeviceBuf<i8>,
    pub vals: DeviceBuf<u16>,
    pub heads: usize,
}

impl Nvfp4Operand {
    /// Allocates an operand of `heads` heads for `plan`.
    pub fn alloc(gpu: &Gpu, plan: &Plan, heads: usize) -> GpuResult<Nvfp4Operand> {
        let t = plan.shape().tokens();
        Ok(Nvfp4Operand {
            codes: DeviceBuf::zeros(gpu, t * heads * 128)?,
            scales: DeviceBuf::zeros(gpu, t * heads * 8)?,
            exps: DeviceBuf::zeros(gpu, t * heads)?,
            vals: DeviceBuf::zeros(gpu, t * heads * 128)?,
            heads,
        })
    }
}

/// Mirrors `struct QuantParams` of `cuda/quant.cu`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct QuantParams {
    x: u64,
    blocks: u64,
    tok: u64,
    dim: u64,
    exps: u64,
    o: u64,
    delta: u64,
    amax_in: u64,
    amax_out: u64,
    fp4_codes: u64,
    fp4_scales: u64,
    fp4_vals: u64,
    t: i32,
    tpad: i32,
    h: i32,
}

/// For dO: the forward output `O` (BF16, same shape) and the `(tokens, heads)` FP32 output `D`.
#[derive(Debug, Clone, Copy)]
pub struct DeltaOut {
    pub o: u64,
    pub delta: u64,
}

/// Scratch of the tensor-wide amax (leaky control).
#[derive(Debug)]
pub struct AmaxScratch(DeviceBuf<u32>);

impl AmaxScratch {
    pub fn new(gpu: &Gpu) -> GpuResult<Self> {
        Ok(AmaxScratch(DeviceBuf::zeros(gpu, 1)?))
    }
}

fn mode_id(mode: ScaleMode) -> i32 {
    match mode {
        ScaleMode::TokenBlock => 0,
        ScaleMode::PerToken => 1,
        ScaleMode::TensorFloor => 2,
    }
}

/// Quantises the BF16 tensor at `x` (`(tokens, heads, 128)`, `heads = out.heads`) into `out` on
/// `stream`: Hadamard rotation first when `hadamard`, exponents by `mode`, and D when `delta`.
/// `amax` is needed for [`ScaleMode::TensorFloor`] only (it adds one amax launch).
#[allow(clippy::too_many_arguments)]
pub fn quantize_e4m3(
    gpu: &Gpu,
    stream: RawStream,
    plan: &Plan,
    x: u64,
    hadamard: bool,
    mode: ScaleMode,
    out: &Operand,
    delta: Option<DeltaOut>,
    amax: Option<&AmaxScratch>,
) -> GpuResult<()> {
    gpu.bind()?;
    let t = plan.shape().tokens();
    let variant = Variant::new()
        .define("HADAMARD", hadamard as i32)
        .define("MODE", mode_id(mode))
        .define("DELTA", delta.is_some() as i32);
    let mut p = QuantParams {
        x,
        blocks: plan.blocks.ptr(),
        tok: out.tok.ptr(),
        dim: out.dim.ptr(),
        exps: out.exps.ptr(),
        t: t as i32,
        tpad: plan.tpad() as i32,
        h: out.heads as i32,
        ..Default::default()
    };
    if let Some(d) = delta {
        p.o = d.o;
        p.delta = d.delta;
    }
    if mode == ScaleMode::TensorFloor {
        let scratch = amax.ok_or_else(|| {
            super::error::GpuError::NotSupported("the tensor-wide (leaky) mode needs an AmaxScratch".into())
        })?;
        let ptr = scratch.0.ptr();
        // SAFETY: one u32 owned by `scratch`, on the caller's stream.
        unsafe { cudarc::driver::sys::cuMemsetD32Async(ptr, 0, 1, stream.0) }
            .result()
            .ctx("cuMemsetD32Async(amax)")?;
        p.amax_in = ptr;
        p.amax_out = ptr;
        let f = gpu.function("quant.cu", &variant, "quant_amax", 0)?;
        let rows = (t * out.heads).div_ceil(4) as u32;
        // SAFETY: params mirror QuantParams; x holds tokens*heads*128 BF16 (caller), amax one u32.
        unsafe { launch(&f, (rows, 1, 1), 128, 0, stream, &p, "quant_amax") }?;
    }
    let f = gpu.function("quant.cu", &variant, "quant_e4m3", 0)?;
    let grid = (plan.tables.blocks.len() as u32, out.heads as u32, 1);
    // SAFETY: params mirror QuantParams; every buffer is sized by `plan` and `out.heads`.
    unsafe { launch(&f, grid, 128, 0, stream, &p, "quant_e4m3") }
}

/// Quantises the BF16 tensor at `x` to NVFP4 (after the Hadamard rotation when `hadamard`).
pub fn quantize_nvfp4(
    gpu: &Gpu,
    stream: RawStream,
    plan: &Plan,
    x: u64,
    hadamard: bool,
    out: &Nvfp4Operand,
) -> GpuResult<()> {
    gpu.bind()?;
    let t = plan.shape().tokens();
    let variant = Variant::new().define("HADAMARD", hadamard as i32);
    let p = QuantParams {
        x,
        exps: out.exps.ptr(),
        fp4_codes: out.codes.ptr(),
        fp4_scales: out.scales.ptr(),
        fp4_vals: out.vals.ptr(),
        t: t as i32,
        tpad: plan.tpad() as i32,
        h: out.heads as i32,
        ..Default::default()
    };
    let f = gpu.function("quant.cu", &variant, "quant_nvfp4", 0)?;
    let rows = (t * out.heads).div_ceil(4) as u32;
    // SAFETY: params mirror QuantParams; buffers sized by `plan` and `out.heads`.
    unsafe { launch(&f, (rows, 1, 1), 128, 0, stream, &p, "quant_nvfp4") }
}
