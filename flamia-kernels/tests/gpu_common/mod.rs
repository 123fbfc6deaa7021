//! Helpers of the GPU tests (`gpu_*.rs`): the device, fresh random BF16 inputs, uploads, the GPU
//! attention as the leakage harness's `AttnFn`, error measures.
//! Layouts: `(tokens, heads, head_dim)` row-major; LSE `(tokens, heads_q)`.
#![allow(dead_code)]

use flamia_kernels::gpu::{DeviceBuf, Gpu, RawStream};
use flamia_kernels::reference::{Forward, Grads};
use flamia_kernels::{AttnOptions, VarlenShape};
use half::bf16;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, StandardNormal};
use std::sync::Arc;

/// The GPU (these tests only run with `--ignored` on a machine that has one).
pub fn gpu() -> Arc<Gpu> {
    Gpu::new(0).unwrap_or_else(|e| panic!("GPU tests need a Hopper GPU: {e}"))
}

/// The legacy default stream (the one `DeviceBuf` uploads on).
pub fn stream() -> RawStream {
    RawStream(std::ptr::null_mut())
}

/// A fresh seed each run, printed so a failure can be replayed with `FLAMIA_SEED`.
pub fn rng(test: &str) -> ChaCha8Rng {
    let seed = std::env::var("FLAMIA_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(1)
        });
    eprintln!("{test}: seed {seed} (FLAMIA_SEED={seed} to replay)");
    ChaCha8Rng::seed_from_u64(seed)
}

/// Rounds to BF16 and back, so CPU and GPU see identical values.
pub fn round_bf16(x: &mut [f32]) {
    for v in x.iter_mut() {
        *v = bf16::from_f32(*v).to_f32();
    }
}

pub fn to_bits(x: &[f32]) -> Vec<u16> {
    x.iter().map(|v| bf16::from_f32(*v).to_bits()).collect()
}

pub fn from_bits(x: &[u16]) -> Vec<f32> {
    x.iter().map(|b| bf16::from_bits(*b).to_f32()).collect()
}

/// Gaussian `(tokens, heads, 128)` values with a random power-of-two scale per token (exponents
/// then differ between tokens and blocks), some all-zero tokens, and a few values exactly at
/// `448 * 2^k` (the exponent rule's boundary). BF16-representable.
pub fn awkward_tensor(rng: &mut ChaCha8Rng, tokens: usize, heads: usize, spread: i32) -> Vec<f32> {
    let d = 128;
    let mut x = vec![0f32; tokens * heads * d];
    for t in 0..tokens {
        for h in 0..heads {
            let row = &mut x[(t * heads + h) * d..(t * heads + h + 1) * d];
            let u: f64 = rng.random();
            if u < 0.03 {
                continue; // all-zero row
            }
            let sc = 2f64.powi(rng.random_range(-spread..=spread));
            for v in row.iter_mut() {
                let g: f64 = StandardNormal.sample(rng);
                *v = (g * sc) as f32;
            }
            if u > 0.97 {
                let k = rng.random_range(0..d);
                row[k] = 448.0 * 2f32.powi(rng.random_range(-4..=4));
            }
        }
    }
    round_bf16(&mut x);
    x
}

/// Plain Gaussian activations `N(0, sigma^2)` in BF16 precision.
pub fn gauss_tensor(rng: &mut ChaCha8Rng, n: usize, sigma: f64) -> Vec<f32> {
    let mut x: Vec<f32> = (0..n)
        .map(|_| {
            let g: f64 = StandardNormal.sample(rng);
            (g * sigma) as f32
        })
        .collect();
    round_bf16(&mut x);
    x
}

pub fn upload_bf16(gpu: &Gpu, x: &[f32]) -> DeviceBuf<u16> {
    DeviceBuf::from_host(gpu, &to_bits(x)).unwrap()
}

/// A BF16 buffer filled with NaN (0xFFFF) so unwritten outputs show.
pub fn poisoned_bf16(gpu: &Gpu, n: usize) -> DeviceBuf<u16> {
    DeviceBuf::from_host(gpu, &vec![0xFFFFu16; n]).unwrap()
}

pub fn poisoned_f32(gpu: &Gpu, n: usize) -> DeviceBuf<f32> {
    DeviceBuf::from_host(gpu, &vec![f32::NAN; n]).unwrap()
}

/// `||a - b|| / ||b||` (Frobenius).
pub fn rel_err(a: &[f32], b: &[f32]) -> f64 {
    let num: f64 = a
        .iter()
        .zip(b)
        .map(|(x, y)| (*x as f64 - *y as f64).powi(2))
        .sum();
    let den: f64 = b.iter().map(|y| (*y as f64) * (*y as f64)).sum();
    (num / den.max(1e-300)).sqrt()
}

pub fn count_nan(a: &[f32]) -> usize {
    a.iter().filter(|x| !x.is_finite()).count()
}

/// The GPU forward + backward on host tensors (outputs poisoned first), as the reference's types.
pub fn gpu_attn(
    gpu: &Arc<Gpu>,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    dout: &[f32],
    shape: &VarlenShape,
    opts: &AttnOptions,
) -> flamia_kernels::Result<(Forward, Grads)> {
    Ok(
        flamia_kernels::gpu::host::forward_backward(gpu, q, k, v, dout, shape, opts)
            .unwrap_or_else(|e| panic!("{e}")),
    )
}
