//! Reference backward, organised around 32x32 dS blocks (rows and columns aligned to the document
//! start) as the kernels run it: one task per (KV head, document, 128-key tile) visits the query
//! heads of its group and the row blocks that see the tile, computes each block's P and dS once
//! ([`BwdCtx::ds_block`]), accumulates the tile's dK, dV and writes each row's partial dQ sum for
//! the tile; the rows then add their key tiles' partials in key-tile order. P is recomputed with
//! the forward's `Ctx::score` and the saved LSE, `D_i = dO_i . O_i` uses the same quantised dO as
//! `dP` (consistency, hopper-kernels.md section 4). Memory: the dQ partials take
//! `heads_q * sum over docs(len^2 / 256) * head_dim` f64 (about 4.6 MB per head for a 1024-token
//! document).
//!
//! Per visible pair (f64): `P = 2^(x_ij - LSE_i / ln 2)`, `dP = dO_i . V_j`, `dS = P (dP - D_i)`.
//! One dS fold rule, shared bit for bit by the v4 backward kernel: the gradient operands'
//! exponents are folded in first, `dS~ = f32(dS * 2^(eQ_i + eK_j))` (exponents clamped to at least
//! -126, as the kernels' `exp2i`), then `e = block_exponent(max |dS~|)`, `code = e4m3_encode(dS~ *
//! 2^-e)`, and the value used is `code * 2^(e - eQ_i - eK_j)`: dQ_i takes its `2^-eQ_i` and dK_j
//! its `2^-eK_j` once per output row, the exponent `2^e` per 32-wide slice of the product.
//! - Default: ONE copy, `e` over the 32x32 block, used by both products. With token-block scales
//!   `eQ + eK` is uniform over a block, so the codes equal those of the unfolded dS; with
//!   per-token scales the fold is what lets one copy serve both products.
//! - `row_ds_exponents`: TWO copies, each row-wise in its product's rows: dQ's with `e` over each
//!   query row's 32 entries of the block (what makes dQ causally safe: a later query never moves
//!   an earlier row's exponent), dK's with `e` over each key column's 32 entries (one exponent
//!   per row of dK's product and 32-query slice, applied per slice in FP32; a per-query exponent
//!   could not be factored out of dK's sum over queries).
//! - `dQ_i = scale * sum over key tiles of (sum_j dS^_ij Kg_j)`: each key tile's partial sum is
//!   prescaled by `2^-s`, rounded to f32 and added to an f32 accumulator in key-tile order (the
//!   kernels' FP32 atomics, made deterministic), then multiplied by `2^s`. `s = floor(log2 B) + 1 - 15`
//!   with `B = 2 d max|dO| max|V| max|Kg| scale`: maxima over the document by default, over the row
//!   and the keys it sees with `causal_dq_scaling`.
//! - `dK_j = scale * sum_i dS^_ij Qg_i`; `dV_j = sum_i decode(Pc_ij) 2^c_j (dO_i 2^-edO_i)` with
//!   `Pc_ij = e4m3_encode(f32(P_ij 2^(edO_i - c_j)))`, `c_j = max(edO over rows that see key j) - 8`.
//! - dQ and dK are rotated back (Hadamard) in f32, then all gradients are rounded to BF16.

use super::fwd::{bf16_round, Ctx, TILE};
use super::operands::{axpy, dot, pow2, Operand};
use crate::formats::{block_exponent, dequantize_e4m3, e4m3_decode, e4m3_encode, quantize_e4m3_scaled};
use crate::hadamard::fwht_normalized;
use crate::quant::TOKEN_BLOCK as B;
use rayon::prelude::*;

/// Backward state shared by the tasks.
pub(crate) struct BwdCtx<'a> {
    pub ctx: &'a Ctx<'a>,
    pub dout: &'a Operand,
    /// `(heads_q, tokens)`: `D_i`.
    pub delta: Vec<f64>,
    /// `(heads_q, tokens)`: `LSE_i / ln 2`.
    pub lse2: Vec<f64>,
    pub row_ds: bool,
    pub causal_dq: bool,
    /// `(heads_q, tokens)`: the (quantised) dO row is all zero, so the row's dS and its dV
    /// contributions are exactly zero and are skipped (the leakage harness zeroes dO rows).
    pub zero_row: Vec<bool>,
}

/// One 32x32 block of P and dequantised dS (zero where masked), row-major `[r * 32 + c]`: `ds`
/// feeds dQ, `ds_k` dK (the same copy unless `row_ds_exponents`: module docs).
struct Block {
    p: [f64; B * B],
    ds: [f64; B * B],
    ds_k: [f64; B * B],
    nonzero: u64,
    zeroed: u64,
}

impl BwdCtx<'_> {
    /// Builds `D` and `LSE / ln 2` from the forward's O and LSE.
    pub fn new<'a>(
        ctx: &'a Ctx<'a>,
        dout: &'a Operand,
        o: &[f32],
        lse: &[f32],
        row_ds: bool,
        causal_dq: bool,
    ) -> BwdCtx<'a> {
        let (t, hq, d) = (ctx.shape.tokens(), ctx.shape.heads_q, ctx.shape.head_dim);
        let mut delta = vec![0f64; hq * t];
        let mut lse2 = vec![0f64; hq * t];
        let mut orow = vec![0f64; d];
        for h in 0..hq {
            for i in 0..t {
                for (a, &b) in orow.iter_mut().zip(&o[(i * hq + h) * d..(i * hq + h + 1) * d]) {
                    *a = b as f64;
                }
                delta[h * t + i] = dot(dout.row(h, i), &orow);
                lse2[h * t + i] = lse[i * hq + h] as f64 / std::f64::consts::LN_2;
            }
        }
        let zero_row = (0..hq)
            .flat_map(|h| (0..t).map(move |i| (h, i)))
            .map(|(h, i)| dout.row_amax(h, i) == 0.0)
            .collect();
        BwdCtx {
            ctx,
            dout,
            delta,
            lse2,
            row_ds,
            causal_dq,
            zero_row,
        }
    }

    /// P and dS of the block with rows `[i0, i0+32)` and keys `[j0, j0+32)` of the document ending
    /// at `e` (clipped to it). The only place P and dS are computed.
    #[inline(always)]
    fn ds_block(&self, h: usize, i0: usize, j0: usize, e: usize) -> Block {
        let ctx = self.ctx;
        let prep = ctx.prep;
        let t = ctx.shape.tokens();
        let g = ctx.kv_head(h);
        let mut b = Block {
            p: [0.0; B * B],
            ds: [0.0; B * B],
            ds_k: [0.0; B * B],
            nonzero: 0,
            zeroed: 0,
        };
        let (i1, j1) = ((i0 + B).min(e), (j0 + B).min(e));
        let mut raw = [0f32; B * B];
        // The fold 2^(eQ_i + eK_j) of the gradient operands' exponents (module docs).
        let mut fold = [1f64; B * B];
        for i in i0..i1 {
            if self.zero_row[h * t + i] {
                continue;
            }
            let jend = ctx.visible_end(i, e).min(j1);
            for j in j0..jend {
                let k = (i - i0) * B + (j - j0);
                let p = (ctx.score(h, i, j) - self.lse2[h * t + i]).exp2();
                let dp = dot(self.dout.row(h, i), prep.v.row(g, j));
                let ds = p * (dp - self.delta[h * t + i]);
                b.p[k] = p;
                b.ds[k] = ds;
                if prep.quantised {
                    fold[k] = pow2(prep.qg().exp(h, i).max(-126) + prep.kg().exp(g, j).max(-126));
                }
                raw[k] = (ds * fold[k]) as f32;
            }
        }
        if !prep.quantised {
            b.ds_k = b.ds;
            return b;
        }
        let amax = |r0: usize, r1: usize| raw[r0 * B..r1 * B].iter().fold(0f32, |m, v| m.max(v.abs()));
        let col_amax = |c: usize| (0..B).fold(0f32, |m, r| m.max(raw[r * B + c].abs()));
        // dS exponents floor at -126 as the kernels' (`e4m3_scale_exp`, `_nn`: a maximum that is
        // zero or an f32 subnormal gives -126 there, where `block_exponent` gives -127; the
        // codes of such a block differ by that factor of two otherwise)
        let block_exponent = |amax: f32| block_exponent(amax).max(-126);
        let block_e = block_exponent(amax(0, B));
        // dK's copy: one exponent per key column (row_ds), else the block's
        let col_e: [i8; B] = std::array::from_fn(|c| {
            if self.row_ds {
                block_exponent(col_amax(c))
            } else {
                block_e
            }
        });
        for r in 0..i1 - i0 {
            let e_row = if self.row_ds {
                block_exponent(amax(r, r + 1))
            } else {
                block_e
            };
            let jend = ctx.visible_end(i0 + r, e).min(j1);
            for (c, &ce) in col_e.iter().enumerate().take(jend.saturating_sub(j0)) {
                let k = r * B + c;
                let code = quantize_e4m3_scaled(raw[k], e_row);
                b.ds[k] = dequantize_e4m3(code, e_row) / fold[k];
                b.ds_k[k] = if self.row_ds {
                    dequantize_e4m3(quantize_e4m3_scaled(raw[k], ce), ce) / fold[k]
                } else {
                    b.ds[k]
                };
                if raw[k] != 0.0 {
                    b.nonzero += 1;
                    b.zeroed += (code & 0x7F == 0) as u64;
                }
            }
        }
        b
    }
}

/// Upper bound of `|dQ|` elements used for the prescale, and the prescale exponent.
fn prescale_exponent(bound: f64) -> i32 {
    if bound <= 0.0 {
        return 0;
    }
    let e = ((bound.to_bits() >> 52) & 0x7FF) as i32 - 1023; // floor(log2 bound) for normal bounds
    (e + 1 - 15).clamp(-120, 120)
}

/// Per-token row amax of an operand, `(heads, tokens)`.
fn row_amax(op: &Operand, heads: usize) -> Vec<f64> {
    (0..heads)
        .flat_map(|h| (0..op.tokens).map(move |t| op.row_amax(h, t)))
        .collect()
}

/// Output of one key-tile task: dK, dV rows of the tile (dK in the rotated basis, unscaled sums)
/// and, per query head of the group, the tile's partial dQ sums of the rows that see it.
struct KvTile {
    g: usize,
    s: usize,
    c0: usize,
    dk: Vec<f64>,
    dv: Vec<f64>,
    /// Rows `[rstart, e)`; `dq_partial[h - g * group]` is `(e - rstart, head_dim)`.
    rstart: usize,
    dq_partial: Vec<Vec<f64>>,
    nonzero: u64,
    zeroed: u64,
}

/// Runs the backward; returns `(dq, dk, dv, ds_zero_fraction)` in `(tokens, heads, head_dim)`.
pub(crate) fn backward(b: &BwdCtx) -> (Vec<f32>, Vec<f32>, Vec<f32>, f64) {
    let ctx = b.ctx;
    let shape = ctx.shape;
    let (t, hq, hkv, d) = (shape.tokens(), shape.heads_q, shape.heads_kv, shape.head_dim);
    let quantised = ctx.prep.quantised;
    let docs: Vec<(usize, usize)> = shape.cu_seqlens.windows(2).map(|w| (w[0], w[1])).collect();
    let k_tasks: Vec<_> = (0..hkv)
        .flat_map(|g| {
            docs.iter()
                .flat_map(move |&(s, e)| (s..e).step_by(TILE).map(move |c0| (g, s, e, c0)))
        })
        .collect();
    let dout_refs = if quantised { dout_fold_refs(b) } else { Vec::new() };
    let tiles: Vec<KvTile> = k_tasks
        .par_iter()
        .map(|&(g, s, e, c0)| kv_tile(b, &dout_refs, g, s, e, c0))
        .collect();

    // dQ: each row sums its key tiles' partials in key-tile order (the kernels' FP32 atomics,
    // made deterministic), prescaled on quantised paths.
    let amax = quantised.then(|| {
        (
            row_amax(b.dout, hq),
            row_amax(&ctx.prep.v, hkv),
            row_amax(ctx.prep.kg(), hkv),
        )
    });
    let q_tasks: Vec<_> = (0..hq)
        .flat_map(|h| {
            docs.iter()
                .flat_map(move |&(s, e)| (s..e).step_by(TILE).map(move |r0| (h, s, e, r0)))
        })
        .collect();
    let dq_rows: Vec<(usize, usize, Vec<f32>)> = q_tasks
        .par_iter()
        .map(|&(h, s, e, r0)| (h, r0, dq_rows(b, &tiles, amax.as_ref(), h, s, e, r0)))
        .collect();

    let finish = |row: &mut [f32]| {
        if ctx.prep.rotated {
            fwht_normalized(row).expect("head dim validated");
        }
        if quantised {
            row.iter_mut().for_each(|v| *v = bf16_round(*v));
        }
    };
    let (mut dq, mut dk, mut dv) = (
        vec![0f32; t * hq * d],
        vec![0f32; t * hkv * d],
        vec![0f32; t * hkv * d],
    );
    for (h, r0, rows) in dq_rows {
        for (r, row) in rows.chunks_exact(d).enumerate() {
            let at = ((r0 + r) * hq + h) * d;
            dq[at..at + d].copy_from_slice(row);
            finish(&mut dq[at..at + d]);
        }
    }
    let (mut nonzero, mut zeroed) = (0u64, 0u64);
    for tile in &tiles {
        nonzero += tile.nonzero;
        zeroed += tile.zeroed;
        for (r, (krow, vrow)) in tile.dk.chunks_exact(d).zip(tile.dv.chunks_exact(d)).enumerate() {
            let at = ((tile.c0 + r) * hkv + tile.g) * d;
            for (x, &y) in dk[at..at + d].iter_mut().zip(krow) {
                *x = (y * ctx.scale) as f32;
            }
            finish(&mut dk[at..at + d]);
            for (x, &y) in dv[at..at + d].iter_mut().zip(vrow) {
                *x = if quantised { bf16_round(y as f32) } else { y as f32 };
            }
        }
    }
    let frac = if nonzero == 0 {
        0.0
    } else {
        zeroed as f64 / nonzero as f64
    };
    (dq, dk, dv, frac)
}

/// `c_j` of every `(query head, token)`: max dO exponent over rows that see key `j`, minus 8.
fn dout_fold_refs(b: &BwdCtx) -> Vec<i32> {
    let shape = b.ctx.shape;
    let t = shape.tokens();
    let mut c = vec![0i32; shape.heads_q * t];
    for h in 0..shape.heads_q {
        for w in shape.cu_seqlens.windows(2) {
            let (s, e) = (w[0], w[1]);
            let doc_max = (s..e).map(|i| b.dout.exp(h, i)).max().unwrap_or(0);
            let mut run = i32::MIN;
            for j in (s..e).rev() {
                run = run.max(b.dout.exp(h, j));
                c[h * t + j] = if b.ctx.causal { run } else { doc_max } - 8;
            }
        }
    }
    c
}

type Amax = (Vec<f64>, Vec<f64>, Vec<f64>);

/// dQ rows `[r0, min(r0 + TILE, e))` of query head `h` (rotated basis, not yet BF16).
#[allow(clippy::too_many_arguments)]
fn dq_rows(
    b: &BwdCtx,
    tiles: &[KvTile],
    amax: Option<&Amax>,
    h: usize,
    s: usize,
    e: usize,
    r0: usize,
) -> Vec<f32> {
    let ctx = b.ctx;
    let (t, d, group) = (ctx.shape.tokens(), ctx.shape.head_dim, ctx.shape.group());
    let g = ctx.kv_head(h);
    let r1 = (r0 + TILE).min(e);
    // Prescale exponent per row: document-wide maxima, or the row's visible keys only.
    let prescale = |i: usize| -> i32 {
        let Some((ado, av, ak)) = amax else { return 0 };
        let max = |a: &Vec<f64>, head: usize, from: usize, to: usize| {
            a[head * t + from..head * t + to]
                .iter()
                .fold(0f64, |m, &v| m.max(v))
        };
        let bound = |dom: f64, vm: f64, km: f64| 2.0 * d as f64 * dom * vm * km * ctx.scale;
        if b.causal_dq {
            let vend = ctx.visible_end(i, e);
            prescale_exponent(bound(ado[h * t + i], max(av, g, s, vend), max(ak, g, s, vend)))
        } else {
            prescale_exponent(bound(max(ado, h, s, e), max(av, g, s, e), max(ak, g, s, e)))
        }
    };
    let mine: Vec<&KvTile> = tiles.iter().filter(|x| x.g == g && x.s == s).collect();
    let mut out = Vec::with_capacity((r1 - r0) * d);
    let mut acc32 = vec![0f32; d];
    let mut acc64 = vec![0f64; d];
    for i in r0..r1 {
        let sc = prescale(i);
        let f = ctx.scale * pow2(-sc);
        acc32.fill(0.0);
        acc64.fill(0.0);
        for tile in mine.iter().filter(|x| x.rstart <= i) {
            let part = &tile.dq_partial[h - g * group][(i - tile.rstart) * d..(i - tile.rstart + 1) * d];
            if ctx.prep.quantised {
                for (a, &p) in acc32.iter_mut().zip(part) {
                    *a += (p * f) as f32;
                }
            } else {
                for (a, &p) in acc64.iter_mut().zip(part) {
                    *a += p * ctx.scale;
                }
            }
        }
        if ctx.prep.quantised {
            out.extend(acc32.iter().map(|&a| (a as f64 * pow2(sc)) as f32));
        } else {
            out.extend(acc64.iter().map(|&a| a as f32));
        }
    }
    out
}

/// One key tile `[c0, min(c0 + TILE, e))` of KV head `g`: every dS block that touches it, once.
/// AVX code generation where the CPU has it (same IEEE operations as SSE2: identical bits).
fn kv_tile(b: &BwdCtx, dout_refs: &[i32], g: usize, s: usize, e: usize, c0: usize) -> KvTile {
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx") {
        // SAFETY: the CPU supports AVX (checked just above).
        return unsafe { kv_tile_avx(b, dout_refs, g, s, e, c0) };
    }
    kv_tile_body(b, dout_refs, g, s, e, c0)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx")]
unsafe fn kv_tile_avx(b: &BwdCtx, dout_refs: &[i32], g: usize, s: usize, e: usize, c0: usize) -> KvTile {
    kv_tile_body(b, dout_refs, g, s, e, c0)
}

#[inline(always)]
fn kv_tile_body(b: &BwdCtx, dout_refs: &[i32], g: usize, s: usize, e: usize, c0: usize) -> KvTile {
    let ctx = b.ctx;
    let (t, d, group) = (ctx.shape.tokens(), ctx.shape.head_dim, ctx.shape.group());
    let (qg, kg) = (ctx.prep.qg(), ctx.prep.kg());
    let c1 = (c0 + TILE).min(e);
    let nc = c1 - c0;
    let rstart = if ctx.causal { c0 } else { s };
    let mut dk = vec![0f64; nc * d];
    let mut dv = vec![0f64; nc * d];
    let mut dq_partial = vec![vec![0f64; (e - rstart) * d]; group];
    let (mut nonzero, mut zeroed) = (0, 0);
    for h in g * group..(g + 1) * group {
        let part = &mut dq_partial[h - g * group];
        for i0 in (rstart..e).step_by(B) {
            for j0 in (c0..c1).step_by(B) {
                if ctx.causal && j0 > i0 + B - 1 {
                    continue;
                }
                let blk = b.ds_block(h, i0, j0, e);
                nonzero += blk.nonzero;
                zeroed += blk.zeroed;
                for r in 0..(i0 + B).min(e) - i0 {
                    let i = i0 + r;
                    if b.zero_row[h * t + i] {
                        continue;
                    }
                    let do_exp = b.dout.exp(h, i);
                    let prow = &mut part[(i - rstart) * d..(i - rstart + 1) * d];
                    for c in 0..(j0 + B).min(c1) - j0 {
                        let k = r * B + c;
                        let (p, ds, ds_k) = (blk.p[k], blk.ds[k], blk.ds_k[k]);
                        if p == 0.0 && ds == 0.0 && ds_k == 0.0 {
                            continue;
                        }
                        let j = j0 + c;
                        let at = (j - c0) * d;
                        if ds != 0.0 {
                            axpy(prow, ds, kg.row(g, j));
                        }
                        if ds_k != 0.0 {
                            axpy(&mut dk[at..at + d], ds_k, qg.row(h, i));
                        }
                        let w = if ctx.prep.quantised {
                            let cj = dout_refs[h * t + j];
                            let pc = e4m3_encode((p * pow2(do_exp - cj)) as f32);
                            e4m3_decode(pc) as f64 * pow2(cj - do_exp)
                        } else {
                            p
                        };
                        if w != 0.0 {
                            axpy(&mut dv[at..at + d], w, b.dout.row(h, i));
                        }
                    }
                }
            }
        }
    }
    KvTile {
        g,
        s,
        c0,
        dk,
        dv,
        rstart,
        dq_partial,
        nonzero,
        zeroed,
    }
}
