//! How much of the GPU forward's LSE gap to the CPU reference does Hopper's FP8 wgmma accumulator
//! explain?
//!
//! The reference (`reference/fwd.rs`) takes the log2-domain scores as
//! `x_ij = (Qc_i . Kc_j) 2^(eQ_i + eK_j) softmax_scale log2(e)` in f64 from the E4M3 codes: the
//! code dot product is exact there. The kernel's `S = Q K^T` is an RS wgmma m64nNk32 e4m3 per 32
//! head dims (dims 0..31, 32..63, ... in order, the first step with a fresh accumulator), and that
//! accumulator is not FP32 but e8m13 and truncating (`shared/design/wgmma-fp8-notes.md` section 7,
//! bit-exact on the H200): per K = 32 step, the incoming accumulator and the 32 exact products
//! (a product counted with exponent `ea + eb` of its two E4M3 factors, subnormals -6) are cut
//! toward zero to multiples of `2^(emax - 13)`, added exactly, and the sum is cut toward zero to
//! 14 significant bits. The kernel then scales the FP32 `S` by `cf = (2^eQ f32(scale log2 e)) 2^eK`
//! in f32.
//!
//! On the GPU test's spread inputs (Q and K 32-token blocks scaled by `2^u`, u in -2..=2) the
//! scores are larger, softmax is close to one-hot and `LSE ~ max score`, so a relative score error
//! shows up in LSE nearly undiluted. This example computes every row's LSE three ways, with the
//! reference's online softmax in f64 (its 128-key tiles, in its order):
//! - (a) the reference's f64 scores (checked against `reference::forward`'s LSE);
//! - (b) the accumulator model's FP32 `S`, times `cf` in f32;
//! - (c) control: the exact `S` rounded to FP32, times `cf` in f32 (an ideal FP32 accumulator);
//!
//! and prints `||LSE_b - LSE_a|| / ||LSE_a||` (the GPU test's measure), the largest per-row
//! `|LSE_b - LSE_a|`, the mean signed difference (truncation is biased toward zero) and the same
//! for (c), on the inputs of the GPU tests, drawn by the tests' own generators
//! (`tests/gpu_common/inputs.rs`, included by path: ChaCha8 from the seed, `gauss_call`, then
//! `spread_blocks_and_zero_values` for the spread cases).
//!
//! Measured (seeds 1, 2): spread d = 128 (b) 1.101e-4, 1.118e-4 (the H200 gave 1.100e-4 on seed 1
//! and 1.118e-4 on seed 2, session 43); spread d = 64 6.6e-5, 6.2e-5; Gaussian `LENS` d = 128 1.47e-5, 1.48e-5 (the
//! largest GPU gap seen there: 1.6e-5); (c) 6e-9..4e-8 everywhere. (a) equals the reference's
//! LSE bitwise on every row.
//!
//! Backward section (d = 128 cases): how much of the GPU's larger dK gap on spread inputs does
//! the LSE difference alone explain? `reference::forward` gives O and `LSE_ref`; then
//! `reference::backward` runs with `LSE_ref` (g_a) and with (b)'s LSE as f32 (same q, k, v, O,
//! dout; exact scores), and prints `||g_b - g_a|| / ||g_a||` for dQ, dK, dV ((c)'s LSE as a
//! control). Measured (seeds 1, 2): spread dQ 5.97e-3, 5.16e-3; dK 8.09e-3, 7.82e-3; dV 4.83e-3,
//! 7.69e-3 (H200 GPU vs CPU: dQ 5.8e-3, 8.3e-3; dK 1.262e-2, 1.570e-2; dV 7.6e-3, 4.7e-3).
//! Gaussian `LENS`: dQ 1.68e-3, 3.00e-3; dK 1.83e-3, 2.86e-3; dV 3.01e-3, 1.87e-3 (largest GPU
//! dK gap seen: 7.3e-3). (c): 0 except dV 1.0e-5 on spread seed 2; the dS zero fraction does
//! not move. So a ~1e-4 relative LSE shift alone gives dK gaps of 8e-3 on spread inputs, about
//! 3-4x those on Gaussian ones, but not the whole GPU gap; and it is a counterfactual: the GPU
//! backward's `S^T = K Q^T` goes through the same e4m3 accumulator, so its scores carry errors
//! correlated with its LSE's (they partly cancel in P: on spread seed 2 this dV gap exceeds the
//! GPU's).
//!
//! Run: `cargo run --release -p flamia-kernels --example lse_accumulator`.

use flamia_kernels::formats::{e4m3_decode, pow2_f32, pow2_f64};
use flamia_kernels::hadamard::rotate_rows;
use flamia_kernels::numerics::rel_l2;
use flamia_kernels::quant::{quantize_e4m3, E4m3Tensor, ScaleMode};
use flamia_kernels::reference::{self, TILE};
use flamia_kernels::{AttnCall, AttnOptions, AttnPath, VarlenShape};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rayon::prelude::*;

/// The GPU tests' Gaussian document lengths (`LENS` of `tests/gpu_attention.rs`).
const LENS: [usize; 7] = [1, 31, 33, 64, 127, 129, 257];
/// The spread-scale tests' document lengths (`SPREAD_LENS`).
const SPREAD_LENS: [usize; 3] = [1100, 517, 64];

// ---- Inputs: the GPU tests' own generators (one file, so a seed draws the same values). ----

#[path = "../tests/gpu_common/inputs.rs"]
mod inputs;
use inputs::{gauss_call, spread_blocks_and_zero_values};

// ---- The score operands: the reference's `operands::prepare` for mxfp8, as codes. ----

/// E4M3 score operand: codes `(tokens, heads, head_dim)` and exponents `(tokens, heads)`.
struct Codes(E4m3Tensor);

impl Codes {
    /// Q or K as the mxfp8 path quantises them: Hadamard-rotated rows (if on), token-block (or
    /// per-token) power-of-two exponents, E4M3 codes in the rotated basis, dims in order.
    fn new(name: &'static str, x: &[f32], heads: usize, shape: &VarlenShape, opts: &AttnOptions) -> Codes {
        let d = shape.head_dim;
        let x = if opts.precision.hadamard {
            rotate_rows(x, d).unwrap()
        } else {
            x.to_vec()
        };
        let mode = if opts.precision.per_token_scales {
            ScaleMode::PerToken
        } else {
            ScaleMode::TokenBlock
        };
        Codes(quantize_e4m3(name, &x, &shape.cu_seqlens, heads, d, mode).unwrap())
    }

    fn row(&self, t: usize, h: usize) -> &[u8] {
        let (hs, d) = (self.0.heads, self.0.head_dim);
        &self.0.codes[(t * hs + h) * d..(t * hs + h + 1) * d]
    }

    fn exp(&self, t: usize, h: usize) -> i32 {
        self.0.exps[t * self.0.heads + h] as i32
    }
}

// ---- The FP8 wgmma accumulator model. ----

/// `(signed integer significand, exponent)` of every E4M3 code: value `sig 2^(exp - 3)`, the
/// exponent unbiased, subnormals (and zero) -6.
static E4M3_PARTS: [(i64, i32); 256] = e4m3_parts();

const fn e4m3_parts() -> [(i64, i32); 256] {
    let mut t = [(0i64, 0i32); 256];
    let mut c = 0;
    while c < 256 {
        let field = ((c >> 3) & 0xF) as i32;
        let man = (c & 7) as i64;
        let (sig, exp) = if field == 0 {
            (man, -6)
        } else {
            (8 + man, field - 7)
        };
        t[c] = (if c & 0x80 != 0 { -sig } else { sig }, exp);
        c += 1;
    }
    t
}

/// Unbiased exponent of a non-zero finite f64 (`floor(log2 |x|)` for normal values).
fn f64_exp(x: f64) -> i32 {
    ((x.to_bits() >> 52) & 0x7FF) as i32 - 1023
}

/// One K = 32 step of the FP8 wgmma accumulator: `acc` plus the products of `a` and `b`.
fn wgmma_step(acc: f32, a: &[u8], b: &[u8]) -> f32 {
    // Products as sig_a sig_b 2^(ea + eb - 6), each with exponent ea + eb; zero products skipped.
    let mut prods = [(0i64, 0i32); 32];
    let mut n = 0;
    let mut emax = i32::MIN;
    for (&ca, &cb) in a.iter().zip(b) {
        let ((sa, ea), (sb, eb)) = (E4M3_PARTS[ca as usize], E4M3_PARTS[cb as usize]);
        if sa != 0 && sb != 0 {
            prods[n] = (sa * sb, ea + eb);
            emax = emax.max(ea + eb);
            n += 1;
        }
    }
    let acc = acc as f64;
    if acc != 0.0 {
        emax = emax.max(f64_exp(acc));
    }
    if emax == i32::MIN {
        return 0.0;
    }
    // Every term in units of q = 2^(emax - 13), cut toward zero, summed exactly: a product is
    // sig_a sig_b 2^(7 - (emax - e)) units.
    let mut sum = (acc * pow2_f64(13 - emax)).trunc() as i64;
    for &(p, e) in &prods[..n] {
        let sh = 7 - (emax - e);
        sum += if sh >= 0 {
            p << sh
        } else if sh > -16 {
            p / (1i64 << -sh)
        } else {
            0
        };
    }
    // Cut toward zero to 14 significant bits (13 fraction bits below the leading one): e8m13.
    let bits = 64 - sum.unsigned_abs().leading_zeros() as i32;
    if bits > 14 {
        let sh = bits - 14;
        sum = sum.signum() * ((sum.unsigned_abs() >> sh) << sh) as i64;
    }
    (sum as f64 * pow2_f64(emax - 13)) as f32
}

/// `S = a . b` as the FP8 wgmma chain computes it: 32-dim steps in order from a zero accumulator.
fn wgmma_dot(a: &[u8], b: &[u8]) -> f32 {
    a.chunks_exact(32)
        .zip(b.chunks_exact(32))
        .fold(0f32, |acc, (x, y)| wgmma_step(acc, x, y))
}

/// The exact code dot product (every product and partial sum is exact in f64).
fn exact_dot(a: &[u8], b: &[u8]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(&x, &y)| e4m3_decode(x) as f64 * e4m3_decode(y) as f64)
        .sum()
}

// ---- LSE per row, three ways. ----

/// The number of score variants: (a) reference f64, (b) accumulator model, (c) exact S in FP32.
const VARIANTS: usize = 3;

/// One row's LSE per variant and its scores' squared errors against (a).
struct RowOut {
    lse: [f64; VARIANTS],
    /// `sum_j (x_j - xa_j)^2` per variant, and `sum_j xa_j^2` in slot 0.
    score_sq: [f64; VARIANTS],
    /// `max_j xa_j`.
    max_score: f64,
}

/// Online softmax of row `i` of query head `h` (document `s..e`) over the reference's 128-key
/// tiles, for the three score variants at once.
fn row_lse(
    q: &Codes,
    k: &Codes,
    shape: &VarlenShape,
    opts: &AttnOptions,
    h: usize,
    i: usize,
    doc: (usize, usize),
) -> RowOut {
    let g = h / (shape.heads_q / shape.heads_kv);
    let (s, e) = doc;
    let vis_end = if opts.causal { i + 1 } else { e };
    let scale = opts.scale(shape.head_dim);
    let c64 = scale as f64 * std::f64::consts::LOG2_E;
    // The kernel's row factor qf = 2^eQ * f32(scale * log2 e), and per key cf = qf * 2^eK (f32).
    let qf = pow2_f32(q.exp(i, h)) * (scale * std::f32::consts::LOG2_E);
    let qrow = q.row(i, h);
    let mut m = [f64::NEG_INFINITY; VARIANTS];
    let mut l = [0f64; VARIANTS];
    let mut score_sq = [0f64; VARIANTS];
    let mut max_score = f64::NEG_INFINITY;
    let mut x = vec![[0f64; VARIANTS]; TILE];
    for k0 in (s..vis_end).step_by(TILE) {
        let k1 = (k0 + TILE).min(vis_end);
        let xs = &mut x[..k1 - k0];
        for (xj, j) in xs.iter_mut().zip(k0..k1) {
            let krow = k.row(j, g);
            let (eq, ek) = (q.exp(i, h), k.exp(j, g));
            let exact = exact_dot(qrow, krow);
            let cf = qf * pow2_f32(ek);
            *xj = [
                exact * pow2_f64(eq + ek) * c64,
                (wgmma_dot(qrow, krow) * cf) as f64,
                (exact as f32 * cf) as f64,
            ];
            score_sq[0] += xj[0] * xj[0];
            for v in 1..VARIANTS {
                score_sq[v] += (xj[v] - xj[0]).powi(2);
            }
            max_score = max_score.max(xj[0]);
        }
        for v in 0..VARIANTS {
            let m_new = xs.iter().fold(m[v], |a, b| a.max(b[v]));
            l[v] *= (m[v] - m_new).exp2();
            l[v] += xs.iter().map(|xj| (xj[v] - m_new).exp2()).sum::<f64>();
            m[v] = m_new;
        }
    }
    RowOut {
        lse: std::array::from_fn(|v| (m[v] + l[v].log2()) * std::f64::consts::LN_2),
        score_sq,
        max_score,
    }
}

/// Runs one case and prints its lines; with `backward`, also the backward section (see the module
/// docs).
fn case(tag: &str, call: &AttnCall, backward: bool) {
    let (shape, opts) = (&call.shape, &call.opts);
    assert_eq!(opts.path, AttnPath::Mxfp8, "the example models the mxfp8 path");
    let (hq, hkv) = (shape.heads_q, shape.heads_kv);
    let q = Codes::new("q", &call.q, hq, shape, opts);
    let k = Codes::new("k", &call.k, hkv, shape, opts);
    let mut rows = Vec::new();
    for h in 0..hq {
        for w in shape.cu_seqlens.windows(2) {
            rows.extend((w[0]..w[1]).map(|i| (h, i, (w[0], w[1]))));
        }
    }
    let outs: Vec<RowOut> = rows
        .par_iter()
        .map(|&(h, i, doc)| row_lse(&q, &k, shape, opts, h, i, doc))
        .collect();
    // LSE layout (tokens, heads_q), as the reference's.
    let mut lse = vec![vec![0f64; shape.tokens() * hq]; VARIANTS];
    let mut score_sq = [0f64; VARIANTS];
    for (&(h, i, _), out) in rows.iter().zip(&outs) {
        for v in 0..VARIANTS {
            lse[v][i * hq + h] = out.lse[v];
            score_sq[v] += out.score_sq[v];
        }
    }
    let mean_max = outs.iter().map(|o| o.max_score).sum::<f64>() / outs.len() as f64;
    let rms_lse = (lse[0].iter().map(|x| x * x).sum::<f64>() / lse[0].len() as f64).sqrt();

    // (a) against the reference itself: the same inputs and scores.
    let fwd = reference::forward(&call.q, &call.k, &call.v, shape, opts).unwrap();
    let ref_lse = &fwd.lse;
    let a32: Vec<f32> = lse[0].iter().map(|&x| x as f32).collect();
    let same = a32
        .iter()
        .zip(ref_lse)
        .filter(|(x, y)| x.to_bits() == y.to_bits())
        .count();
    let ref_max = a32
        .iter()
        .zip(ref_lse)
        .fold(0f32, |m, (x, y)| m.max((x - y).abs()));
    println!(
        "{tag}: {} rows; (a) vs reference::forward LSE: {same}/{} bitwise equal, max |diff| {ref_max:.1e}, \
         rel L2 {:.1e}",
        a32.len(),
        a32.len(),
        rel_l2(&a32, ref_lse)
    );
    println!(
        "    scores: mean row max x {mean_max:.1} (log2 units), rms LSE {rms_lse:.2}; score rel L2 vs (a): \
         model {:.2e}, fp32 {:.2e}",
        (score_sq[1] / score_sq[0]).sqrt(),
        (score_sq[2] / score_sq[0]).sqrt()
    );
    for (v, name) in [(1, "(b) accumulator model"), (2, "(c) exact S in fp32  ")] {
        let (mut num, mut den, mut worst, mut signed) = (0f64, 0f64, (0f64, 0usize), 0f64);
        for (r, (&b, &a)) in lse[v].iter().zip(&lse[0]).enumerate() {
            num += (b - a).powi(2);
            den += a * a;
            signed += b - a;
            if (b - a).abs() > worst.0 {
                worst = ((b - a).abs(), r);
            }
        }
        println!(
            "    {name}: ||LSE - LSE_a|| / ||LSE_a|| = {:.3e}; max |LSE - LSE_a| = {:.3e} (token {}, head {}, \
             LSE_a {:.3}); mean (LSE - LSE_a) = {:.2e}",
            (num / den).sqrt(),
            worst.0,
            worst.1 / hq,
            worst.1 % hq,
            lse[0][worst.1],
            signed / lse[v].len() as f64
        );
    }
    if backward {
        backward_gaps(call, &fwd, &lse);
    }
}

/// The backward section: `reference::backward` with the reference's own LSE (g_a) and with the
/// model's (b) and the control's (c) LSE as f32 (same O, q, k, v, dout), and the relative L2 gaps
/// `||g_v - g_a|| / ||g_a||` of dQ, dK, dV.
fn backward_gaps(call: &AttnCall, fwd: &reference::Forward, lse: &[Vec<f64>]) {
    let (shape, opts) = (&call.shape, &call.opts);
    let bwd = |l: &[f32]| {
        reference::backward(&call.q, &call.k, &call.v, &fwd.o, l, &call.dout, shape, opts).unwrap()
    };
    let ga = bwd(&fwd.lse);
    for (v, name) in [(1, "(b) accumulator model"), (2, "(c) exact S in fp32  ")] {
        let l32: Vec<f32> = lse[v].iter().map(|&x| x as f32).collect();
        let g = bwd(&l32);
        println!(
            "    backward with LSE {name}: rel L2 vs LSE_ref: dQ {:.3e}, dK {:.3e}, dV {:.3e} \
             (LSE f32 rel L2 {:.2e}; dS zero fraction {:.4} vs {:.4})",
            rel_l2(&g.dq, &ga.dq),
            rel_l2(&g.dk, &ga.dk),
            rel_l2(&g.dv, &ga.dv),
            rel_l2(&l32, &fwd.lse),
            g.ds_zero_fraction,
            ga.ds_zero_fraction
        );
    }
}

fn main() {
    let opts = AttnOptions::new(AttnPath::Mxfp8);
    for d in [128, 64] {
        let shape = VarlenShape::from_lens(&SPREAD_LENS, 4, 2, d).unwrap();
        for seed in [1u64, 2] {
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            let call = gauss_call(&mut rng, &shape, opts);
            let call = spread_blocks_and_zero_values(&mut rng, call, &SPREAD_LENS);
            case(
                &format!("spread scales {SPREAD_LENS:?} 4/2, d = {d}, seed {seed}"),
                &call,
                d == 128,
            );
        }
    }
    let shape = VarlenShape::from_lens(&LENS, 4, 2, 128).unwrap();
    for seed in [1u64, 2] {
        let call = gauss_call(&mut ChaCha8Rng::seed_from_u64(seed), &shape, opts);
        case(
            &format!("gaussian {LENS:?} 4/2, d = 128, seed {seed}"),
            &call,
            true,
        );
    }
}
