//! The GPU tests' random inputs that need no GPU: Gaussian BF16 calls and the spread block scales
//! with all-zero V runs. One file for the tests (`gpu_common`) and `examples/lse_accumulator.rs`
//! (by `#[path]`), so a seed draws the same inputs in both.
#![allow(dead_code)]

use flamia_kernels::{AttnCall, AttnOptions, VarlenShape};
use half::bf16;
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, StandardNormal};

/// Plain Gaussian activations `N(0, sigma^2)` in BF16 precision.
pub fn gauss_tensor(rng: &mut ChaCha8Rng, n: usize, sigma: f64) -> Vec<f32> {
    let mut x: Vec<f32> = (0..n)
        .map(|_| {
            let g: f64 = StandardNormal.sample(rng);
            (g * sigma) as f32
        })
        .collect();
    x.iter_mut().for_each(|v| *v = bf16::from_f32(*v).to_f32());
    x
}

/// Gaussian N(0, 1) q, k, v, dout in BF16 precision for `shape`, as one call with `opts`.
pub fn gauss_call(rng: &mut ChaCha8Rng, shape: &VarlenShape, opts: AttnOptions) -> AttnCall {
    let (t, hq, hkv, d) = (shape.tokens(), shape.heads_q, shape.heads_kv, shape.head_dim);
    let q = gauss_tensor(rng, t * hq * d, 1.0);
    let k = gauss_tensor(rng, t * hkv * d, 1.0);
    let v = gauss_tensor(rng, t * hkv * d, 1.0);
    let dout = gauss_tensor(rng, t * hq * d, 1.0);
    AttnCall::new(q, k, v, dout, shape.clone(), opts).unwrap()
}

/// `call` with every input's 32-token blocks (from each document's start, as the quantisers'
/// blocks) scaled by 2^u, u uniform in -10..=10 per block for V and dO and in -2..=2 for Q and K,
/// and V zero over two runs: one whole 128-key tile of the first
/// document (keys 256..383) and the first 32-token block of the second. Gaussian inputs alone
/// give nearly every block the same exponent (-6 or -7), so the tests could not tell the kernels'
/// folds (P's V exponent per key tile, dS's Q and K exponents) from the reference's (a running
/// maximum of eV over the visible keys; docs/numerics.md) or see an O rescaled by 2^(Ev_old -
/// Ev_new) overflow after an all-zero V tile (a review's concern, session 41).
pub fn spread_blocks_and_zero_values(rng: &mut ChaCha8Rng, mut call: AttnCall, lens: &[usize]) -> AttnCall {
    let (hq, hkv, d) = (call.shape.heads_q, call.shape.heads_kv, call.shape.head_dim);
    // (the quantisers' blocks: 32 tokens from each document's start; Q and K only by 2^+-2, so
    // the scores do not grow to thousands of log2 units, where softmax is one-hot and a near tie
    // flips between the FP8 products' and the f64 reference's rounding; V and dO by 2^+-10)
    for (x, heads, spread) in [
        (&mut call.q, hq, 2),
        (&mut call.k, hkv, 2),
        (&mut call.v, hkv, 10),
        (&mut call.dout, hq, 10),
    ] {
        let mut s = 0;
        for &len in lens {
            for b0 in (s..s + len).step_by(32) {
                let f = 2f32.powi(rng.random_range(-spread..=spread));
                let b1 = (b0 + 32).min(s + len);
                x[b0 * heads * d..b1 * heads * d].iter_mut().for_each(|v| *v *= f);
            }
            s += len;
        }
    }
    let row = hkv * d;
    call.v[256 * row..384 * row].iter_mut().for_each(|v| *v = 0.0);
    call.v[lens[0] * row..(lens[0] + 32) * row]
        .iter_mut()
        .for_each(|v| *v = 0.0);
    call
}
