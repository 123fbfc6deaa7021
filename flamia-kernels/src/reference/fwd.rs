//! Reference forward: one task per (query head, document, 128-query tile), key tiles of 128 in
//! order with online softmax, the diagonal tile masked element-wise; P rounded to E4M3 with the V
//! token exponent folded in. Writes O `(tokens, heads_q, head_dim)` and LSE `(tokens, heads_q)`.
//!
//! Per row `i` (log2 domain, `x_ij = (Qs_i . Ks_j) * softmax_scale * log2(e)`, f64):
//! - key tile `kt`: `m' = max(m, max_j x_ij)`, `alpha = 2^(m - m')`, `l = l alpha + sum_j 2^(x_ij - m')`,
//!   `r' = max(r, max_j eV_j - 8)`,
//!   `acc = acc alpha 2^(r - r') + sum_j decode(Pc_ij) * (V_j * 2^-eV_j)` with
//!   `Pc_ij = e4m3_encode(f32(2^(x_ij - m') * 2^(eV_j - r')))`, `j` over the tile's keys visible
//!   to the row;
//! - `r` (the fold's reference exponent) is the running maximum of `eV_j - 8` over the keys the row
//!   has seen, tile by tile: folded probabilities stay <= 2^8, clear of saturation at 448 and of
//!   the subnormals below 2^-6; it depends on visible keys only, so the fold cannot leak; and the
//!   factor `2^(r - r')` that rescales the earlier tiles' sum is <= 1, so no tile's keys (an
//!   all-zero V tile's `eV` is the zero sentinel) can blow it up. The v4 forward keeps the same
//!   running maximum (`FWD_EV_RUN`, `softmax.cuh`).
//! - `O_i = acc * 2^r / l` rounded to BF16; `LSE_i = ln(2) (m + log2 l)` as f32.
//!
//! `exact`: the same loop with unquantised `p` and `V`, f64 throughout, O as f32.

use super::operands::{axpy, dot, pow2, Prepared};
use crate::formats::{e4m3_decode, e4m3_encode};
use crate::options::VarlenShape;
use rayon::prelude::*;

/// Query and key tile size of the reference (and of the GPU kernels it specifies).
pub const TILE: usize = 128;

/// What the forward and backward share: the scores and the visibility rule.
pub(crate) struct Ctx<'a> {
    pub shape: &'a VarlenShape,
    pub prep: &'a Prepared,
    pub causal: bool,
    /// `softmax_scale * log2(e)`.
    pub c: f64,
    /// `softmax_scale`.
    pub scale: f64,
}

impl Ctx<'_> {
    /// KV head read by query head `h`.
    #[inline]
    pub fn kv_head(&self, h: usize) -> usize {
        h / self.shape.group()
    }

    /// End (exclusive) of the keys visible to row `i` of the document ending at `end`.
    #[inline]
    pub fn visible_end(&self, i: usize, end: usize) -> usize {
        if self.causal {
            i + 1
        } else {
            end
        }
    }

    /// `x_ij`: the score in the log2 domain. Forward and backward call exactly this.
    #[inline(always)]
    pub fn score(&self, h: usize, i: usize, j: usize) -> f64 {
        dot(self.prep.qs.row(h, i), self.prep.ks.row(self.kv_head(h), j)) * self.c
    }
}

/// Rounds to BF16 (round to nearest even) and back: the kernels' output format.
#[inline]
pub(crate) fn bf16_round(x: f32) -> f32 {
    half::bf16::from_f32(x).to_f32()
}

/// One query tile's rows: O rows and LSE values.
struct TileOut {
    h: usize,
    row0: usize,
    o: Vec<f32>,
    lse: Vec<f32>,
}

/// Runs the forward over every (head, document, query tile) in parallel.
pub(crate) fn forward(ctx: &Ctx) -> (Vec<f32>, Vec<f32>) {
    let shape = ctx.shape;
    let (t, hq, d) = (shape.tokens(), shape.heads_q, shape.head_dim);
    let mut tasks = Vec::new();
    for h in 0..hq {
        for w in shape.cu_seqlens.windows(2) {
            for r0 in (w[0]..w[1]).step_by(TILE) {
                tasks.push((h, w[0], w[1], r0));
            }
        }
    }
    let outs: Vec<TileOut> = tasks
        .par_iter()
        .map(|&(h, s, e, r0)| forward_tile(ctx, h, s, e, r0))
        .collect();
    let mut o = vec![0f32; t * hq * d];
    let mut lse = vec![0f32; t * hq];
    for out in outs {
        for (r, (orow, &l)) in out.o.chunks_exact(d).zip(&out.lse).enumerate() {
            let i = out.row0 + r;
            o[(i * hq + out.h) * d..(i * hq + out.h + 1) * d].copy_from_slice(orow);
            lse[i * hq + out.h] = l;
        }
    }
    (o, lse)
}

/// Runs [`forward_tile_body`] with AVX code generation where the CPU has it. AVX without FMA
/// performs the same IEEE operations per element as SSE2, so the results are bitwise identical.
fn forward_tile(ctx: &Ctx, h: usize, s: usize, e: usize, r0: usize) -> TileOut {
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx") {
        // SAFETY: the CPU supports AVX (checked just above).
        return unsafe { forward_tile_avx(ctx, h, s, e, r0) };
    }
    forward_tile_body(ctx, h, s, e, r0)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx")]
unsafe fn forward_tile_avx(ctx: &Ctx, h: usize, s: usize, e: usize, r0: usize) -> TileOut {
    forward_tile_body(ctx, h, s, e, r0)
}

#[inline(always)]
fn forward_tile_body(ctx: &Ctx, h: usize, s: usize, e: usize, r0: usize) -> TileOut {
    let d = ctx.shape.head_dim;
    let g = ctx.kv_head(h);
    let prep = ctx.prep;
    let r1 = (r0 + TILE).min(e);
    let mut o = Vec::with_capacity((r1 - r0) * d);
    let mut lse = Vec::with_capacity(r1 - r0);
    let mut x = vec![0f64; TILE];
    let mut acc = vec![0f64; d];
    for i in r0..r1 {
        let vis_end = ctx.visible_end(i, e);
        // (the fold's reference: no key seen yet; stays 0 for exact attention)
        let mut ri = if prep.quantised { i32::MIN } else { 0 };
        let (mut m, mut l) = (f64::NEG_INFINITY, 0f64);
        acc.fill(0.0);
        for k0 in (s..vis_end).step_by(TILE) {
            let k1 = (k0 + TILE).min(vis_end);
            let xs = &mut x[..k1 - k0];
            for (xj, j) in xs.iter_mut().zip(k0..k1) {
                *xj = ctx.score(h, i, j);
            }
            let m_new = xs.iter().fold(m, |a, &b| a.max(b));
            let mut alpha = (m - m_new).exp2();
            l *= alpha;
            if prep.quantised {
                let r_new = (k0..k1).map(|j| prep.v.exp(g, j) - 8).fold(ri, i32::max);
                if ri != i32::MIN {
                    // (acc in units of 2^-r: an exact power-of-two rescale, the factor <= 1)
                    alpha *= pow2(ri - r_new);
                }
                ri = r_new;
            }
            for a in acc.iter_mut() {
                *a *= alpha;
            }
            for (&xj, j) in xs.iter().zip(k0..k1) {
                let p = (xj - m_new).exp2();
                l += p;
                if prep.quantised {
                    let ev = prep.v.exp(g, j);
                    let pc = e4m3_encode((p * pow2(ev - ri)) as f32);
                    let w = e4m3_decode(pc) as f64 * pow2(-ev);
                    if w != 0.0 {
                        axpy(&mut acc, w, prep.v.row(g, j));
                    }
                } else {
                    axpy(&mut acc, p, prep.v.row(g, j));
                }
            }
            m = m_new;
        }
        let f = if prep.quantised { pow2(ri) / l } else { 1.0 / l };
        for &a in &acc {
            let y = (a * f) as f32;
            o.push(if prep.quantised { bf16_round(y) } else { y });
        }
        lse.push(((m + l.log2()) * std::f64::consts::LN_2) as f32);
    }
    TileOut { h, row0: r0, o, lse }
}
