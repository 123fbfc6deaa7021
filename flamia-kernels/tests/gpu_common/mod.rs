//! Helpers of the GPU tests (`gpu_*.rs`): the device, the fixed seeds (`FLAMIA_TEST_SEED` replays
//! one), random BF16 inputs, uploads, the GPU attention of one `AttnCall`, error measures. The GPU
//! as the leakage harness's `AttnFn` is `flamia_kernels::gpu::host::attn_fn`.
//! Layouts: `(tokens, heads, head_dim)` row-major; LSE `(tokens, heads_q)`.
#![allow(dead_code)]

mod inputs;
#[allow(unused_imports)]
pub use inputs::{gauss_call, gauss_tensor, spread_blocks_and_zero_values};

use flamia_kernels::gpu::{DeviceBuf, Gpu, RawStream};
use flamia_kernels::reference::{Forward, Grads};
use flamia_kernels::AttnCall;
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

/// The fixed seeds every GPU test runs with (`FLAMIA_TEST_SEED=N` runs seed `N` alone).
pub const SEEDS: [u64; 2] = [1, 2];

/// [`SEEDS`], or the one seed in `FLAMIA_TEST_SEED` (to replay a failure).
pub fn seeds() -> Vec<u64> {
    match std::env::var("FLAMIA_TEST_SEED") {
        Ok(s) => vec![s
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("FLAMIA_TEST_SEED={s:?} is not an unsigned integer"))],
        Err(_) => SEEDS.to_vec(),
    }
}

/// Prints the seed when the test panics while it is alive.
struct SeedGuard {
    test: String,
    seed: u64,
}

impl Drop for SeedGuard {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "{}: FAILED with seed {}; replay it alone with FLAMIA_TEST_SEED={}",
                self.test, self.seed, self.seed
            );
        }
    }
}

/// A ChaCha8 generator from one fixed seed that names its seed if the test fails while it lives.
pub struct SeededRng {
    rng: ChaCha8Rng,
    _guard: SeedGuard,
}

impl std::ops::Deref for SeededRng {
    type Target = ChaCha8Rng;
    fn deref(&self) -> &ChaCha8Rng {
        &self.rng
    }
}

impl std::ops::DerefMut for SeededRng {
    fn deref_mut(&mut self) -> &mut ChaCha8Rng {
        &mut self.rng
    }
}

fn seeded(test: &str, seed: u64) -> SeededRng {
    eprintln!("{test}: seed {seed}");
    SeededRng {
        rng: ChaCha8Rng::seed_from_u64(seed),
        _guard: SeedGuard {
            test: test.to_string(),
            seed,
        },
    }
}

/// The generator of a test that runs one seed: the first of [`seeds`] (`SEEDS[0]`, or
/// `FLAMIA_TEST_SEED`).
pub fn rng(test: &str) -> SeededRng {
    seeded(test, seeds()[0])
}

/// Runs `f` once per seed of [`seeds`]; a failure prints the seed and how to replay it.
pub fn with_seeds(test: &str, mut f: impl FnMut(SeededRng)) {
    for seed in seeds() {
        f(seeded(test, seed));
    }
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
    awkward_tensor_d(rng, tokens, heads, 128, spread)
}

/// [`awkward_tensor`] at head dim `d`: `(tokens, heads, d)` (d = 128 draws the same values).
pub fn awkward_tensor_d(
    rng: &mut ChaCha8Rng,
    tokens: usize,
    heads: usize,
    d: usize,
    spread: i32,
) -> Vec<f32> {
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

pub fn upload_bf16(gpu: &Gpu, x: &[f32]) -> DeviceBuf<u16> {
    DeviceBuf::from_host(gpu, &to_bits(x)).unwrap()
}

/// Q, K, V and dO of `call` uploaded as BF16.
pub fn upload_call(gpu: &Gpu, call: &AttnCall) -> [DeviceBuf<u16>; 4] {
    [&call.q, &call.k, &call.v, &call.dout].map(|x| upload_bf16(gpu, x))
}

/// A BF16 buffer filled with NaN (0xFFFF) so unwritten outputs show.
pub fn poisoned_bf16(gpu: &Gpu, n: usize) -> DeviceBuf<u16> {
    DeviceBuf::from_host(gpu, &vec![0xFFFFu16; n]).unwrap()
}

pub fn poisoned_f32(gpu: &Gpu, n: usize) -> DeviceBuf<f32> {
    DeviceBuf::from_host(gpu, &vec![f32::NAN; n]).unwrap()
}

pub fn count_nan(a: &[f32]) -> usize {
    a.iter().filter(|x| !x.is_finite()).count()
}

/// `call` with its keys' magnitudes spread over the 128-key tiles: token t's K rows scaled by
/// 2^(-5 ((t / 128) mod 4)), so the dQ partials of neighbouring key tiles differ by up to 2^15
/// and their FP32 sum rounds. With Gaussian keys alone the unordered-reduce mutation passed both
/// ordering tests (session 13), most likely because every partial of a query tile was a multiple
/// of one power of two coarse enough that the sum was exact in any order; with this it fails them.
pub fn spread_key_tiles(mut call: AttnCall) -> AttnCall {
    let row = call.shape.heads_kv * call.shape.head_dim;
    for (t, k) in call.k.chunks_mut(row).enumerate() {
        let f = (-5.0 * ((t / 128) % 4) as f32).exp2();
        k.iter_mut().for_each(|x| *x *= f);
    }
    call
}

/// The GPU forward + backward of a call (outputs poisoned first), as the reference's types.
pub fn gpu_attn(gpu: &Arc<Gpu>, call: &AttnCall) -> (Forward, Grads) {
    flamia_kernels::gpu::host::forward_backward(gpu, call).unwrap_or_else(|e| panic!("{e}"))
}

/// Sets an environment variable for the guard's life and puts back what it was (process-wide:
/// the device runs these tests with --test-threads=1; a run may set the variable for the whole
/// suite, e.g. bench/device_s12.sh's variant with every document walking up).
pub struct EnvGuard(&'static str, Option<String>);

impl EnvGuard {
    pub fn set(var: &'static str, value: &str) -> Self {
        let old = std::env::var(var).ok();
        std::env::set_var(var, value);
        EnvGuard(var, old)
    }
}

impl Drop for EnvGuard {
    fn drop(&mut self) {
        match &self.1 {
            Some(v) => std::env::set_var(self.0, v),
            None => std::env::remove_var(self.0),
        }
    }
}
