//! Exact attention on the CPU over packed documents, accumulating in f64: the trainer's CPU
//! implementation of the `bf16` control path and the independent check in the bridge tests.
//!
//! Layouts: q/o/dq `(tokens, heads_q, head_dim)`, k/v/dk/dv `(tokens, heads_kv, head_dim)`,
//! lse `(heads_q, tokens)` (natural log of the sum of `exp(scale * q.k)` over visible keys).
//! GQA: query head `h` reads KV head `h / (heads_q / heads_kv)`.

use flamia_kernels::{AttnOptions, VarlenShape};
use rayon::prelude::*;

/// Keys `[start, end)` visible to query `i` of the document `[start, end_doc)`.
fn visible(i: usize, start: usize, end_doc: usize, causal: bool) -> std::ops::Range<usize> {
    start..if causal { i + 1 } else { end_doc }
}

fn dot(a: &[f32], b: &[f32]) -> f64 {
    a.iter().zip(b).map(|(&x, &y)| x as f64 * y as f64).sum()
}

/// Forward: writes `o` and `lse`.
pub fn forward(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    shape: &VarlenShape,
    opts: &AttnOptions,
    o: &mut [f32],
    lse: &mut [f32],
) {
    let (hq, hkv, d, t) = (shape.heads_q, shape.heads_kv, shape.head_dim, shape.tokens());
    let group = hq / hkv;
    let scale = opts.scale(d) as f64;
    let cu = &shape.cu_seqlens;
    // One task per query head; rows of o for that head are strided, so collect then scatter.
    let per_head: Vec<(Vec<f32>, Vec<f32>)> = (0..hq)
        .into_par_iter()
        .map(|h| {
            let kh = h / group;
            let mut oh = vec![0f32; t * d];
            let mut lh = vec![0f32; t];
            let mut s = Vec::new();
            let mut acc = vec![0f64; d];
            for doc in 0..shape.docs() {
                let (start, end) = (cu[doc], cu[doc + 1]);
                for i in start..end {
                    let qi = &q[(i * hq + h) * d..][..d];
                    let keys = visible(i, start, end, opts.causal);
                    s.clear();
                    s.extend(
                        keys.clone()
                            .map(|j| scale * dot(qi, &k[(j * hkv + kh) * d..][..d])),
                    );
                    let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                    let mut l = 0f64;
                    acc.iter_mut().for_each(|a| *a = 0.0);
                    for (x, j) in s.iter().zip(keys) {
                        let p = (x - m).exp();
                        l += p;
                        let vj = &v[(j * hkv + kh) * d..][..d];
                        acc.iter_mut().zip(vj).for_each(|(a, &vv)| *a += p * vv as f64);
                    }
                    oh[i * d..][..d]
                        .iter_mut()
                        .zip(&acc)
                        .for_each(|(o, a)| *o = (a / l) as f32);
                    lh[i] = (m + l.ln()) as f32;
                }
            }
            (oh, lh)
        })
        .collect();
    for (h, (oh, lh)) in per_head.into_iter().enumerate() {
        for i in 0..t {
            o[(i * hq + h) * d..][..d].copy_from_slice(&oh[i * d..][..d]);
        }
        lse[h * t..][..t].copy_from_slice(&lh);
    }
}

/// Backward from the forward's `o` and `lse`: writes `dq`, `dk`, `dv`.
#[allow(clippy::too_many_arguments)]
pub fn backward(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    o: &[f32],
    lse: &[f32],
    d_o: &[f32],
    shape: &VarlenShape,
    opts: &AttnOptions,
    dq: &mut [f32],
    dk: &mut [f32],
    dv: &mut [f32],
) {
    let (hq, hkv, d, t) = (shape.heads_q, shape.heads_kv, shape.head_dim, shape.tokens());
    let group = hq / hkv;
    let scale = opts.scale(d) as f64;
    let cu = &shape.cu_seqlens;
    // One task per KV head: it owns dK/dV of that head and dQ of its query heads.
    let per_kv: Vec<(Vec<f64>, Vec<f64>, Vec<f64>)> = (0..hkv)
        .into_par_iter()
        .map(|kh| {
            let mut dqh = vec![0f64; group * t * d];
            let mut dkh = vec![0f64; t * d];
            let mut dvh = vec![0f64; t * d];
            for g in 0..group {
                let h = kh * group + g;
                for doc in 0..shape.docs() {
                    let (start, end) = (cu[doc], cu[doc + 1]);
                    for i in start..end {
                        let qi = &q[(i * hq + h) * d..][..d];
                        let doi = &d_o[(i * hq + h) * d..][..d];
                        let delta = dot(doi, &o[(i * hq + h) * d..][..d]);
                        let li = lse[h * t + i] as f64;
                        for j in visible(i, start, end, opts.causal) {
                            let kj = &k[(j * hkv + kh) * d..][..d];
                            let vj = &v[(j * hkv + kh) * d..][..d];
                            let p = (scale * dot(qi, kj) - li).exp();
                            let ds = p * (dot(doi, vj) - delta) * scale;
                            let dqi = &mut dqh[(g * t + i) * d..][..d];
                            dqi.iter_mut().zip(kj).for_each(|(a, &x)| *a += ds * x as f64);
                            dkh[j * d..][..d]
                                .iter_mut()
                                .zip(qi)
                                .for_each(|(a, &x)| *a += ds * x as f64);
                            dvh[j * d..][..d]
                                .iter_mut()
                                .zip(doi)
                                .for_each(|(a, &x)| *a += p * x as f64);
                        }
                    }
                }
            }
            (dqh, dkh, dvh)
        })
        .collect();
    for (kh, (dqh, dkh, dvh)) in per_kv.into_iter().enumerate() {
        for i in 0..t {
            for g in 0..group {
                let h = kh * group + g;
                dq[(i * hq + h) * d..][..d]
                    .iter_mut()
                    .zip(&dqh[(g * t + i) * d..][..d])
                    .for_each(|(o, &a)| *o = a as f32);
            }
            dk[(i * hkv + kh) * d..][..d]
                .iter_mut()
                .zip(&dkh[i * d..][..d])
                .for_each(|(o, &a)| *o = a as f32);
            dv[(i * hkv + kh) * d..][..d]
                .iter_mut()
                .zip(&dvh[i * d..][..d])
                .for_each(|(o, &a)| *o = a as f32);
        }
    }
}
