//! Shared helpers of the CPU tests: random values, a naive f64 attention of an [`AttnCall`], the
//! max-relative error. (Inputs of a whole call: `AttnCall::random`; cosine and relative L2:
//! `flamia_kernels::numerics`.)
#![allow(dead_code)]

use flamia_kernels::AttnCall;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::StandardNormal;

/// Standard normal f32 values.
pub fn normal(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..n).map(|_| rng.sample::<f32, _>(StandardNormal)).collect()
}

/// Naive attention in f64 with materialised scores: (o, lse, dq, dk, dv).
pub struct Naive {
    pub o: Vec<f64>,
    pub lse: Vec<f64>,
    pub dq: Vec<f64>,
    pub dk: Vec<f64>,
    pub dv: Vec<f64>,
}

pub fn naive(call: &AttnCall) -> Naive {
    let AttnCall {
        q, k, v, dout, shape, ..
    } = call;
    let causal = call.opts.causal;
    let (t, hq, hkv, d) = (shape.tokens(), shape.heads_q, shape.heads_kv, shape.head_dim);
    let scale = call.opts.scale(d) as f64;
    let qi = |i: usize, h: usize, x: usize| q[(i * hq + h) * d + x] as f64;
    let ki = |j: usize, g: usize, x: usize| k[(j * hkv + g) * d + x] as f64;
    let vi = |j: usize, g: usize, x: usize| v[(j * hkv + g) * d + x] as f64;
    let gi = |i: usize, h: usize, x: usize| dout[(i * hq + h) * d + x] as f64;
    let mut n = Naive {
        o: vec![0.0; t * hq * d],
        lse: vec![0.0; t * hq],
        dq: vec![0.0; t * hq * d],
        dk: vec![0.0; t * hkv * d],
        dv: vec![0.0; t * hkv * d],
    };
    for w in shape.cu_seqlens.windows(2) {
        let (s, e) = (w[0], w[1]);
        for h in 0..hq {
            let g = h / (hq / hkv);
            for i in s..e {
                let end = if causal { i + 1 } else { e };
                let sc: Vec<f64> = (s..end)
                    .map(|j| (0..d).map(|x| qi(i, h, x) * ki(j, g, x)).sum::<f64>() * scale)
                    .collect();
                let m = sc.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let l: f64 = sc.iter().map(|x| (x - m).exp()).sum();
                n.lse[i * hq + h] = m + l.ln();
                let p: Vec<f64> = sc.iter().map(|x| (x - m).exp() / l).collect();
                for x in 0..d {
                    n.o[(i * hq + h) * d + x] = (s..end).zip(&p).map(|(j, pj)| pj * vi(j, g, x)).sum();
                }
                let dp: Vec<f64> = (s..end)
                    .map(|j| (0..d).map(|x| gi(i, h, x) * vi(j, g, x)).sum())
                    .collect();
                let delta: f64 = p.iter().zip(&dp).map(|(a, b)| a * b).sum();
                for (jj, j) in (s..end).enumerate() {
                    let ds = p[jj] * (dp[jj] - delta);
                    for x in 0..d {
                        n.dq[(i * hq + h) * d + x] += ds * ki(j, g, x) * scale;
                        n.dk[(j * hkv + g) * d + x] += ds * qi(i, h, x) * scale;
                        n.dv[(j * hkv + g) * d + x] += p[jj] * gi(i, h, x);
                    }
                }
            }
        }
    }
    n
}

/// max |a - b| / max |b|.
pub fn rel_max(a: &[f32], b: &[f64]) -> f64 {
    let num = a
        .iter()
        .zip(b)
        .fold(0f64, |m, (&x, &y)| m.max((x as f64 - y).abs()));
    num / b.iter().fold(0f64, |m, &y| m.max(y.abs()))
}
