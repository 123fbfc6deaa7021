//! Normalised Walsh-Hadamard rotation over the head dim of `(tokens, heads, head_dim)` tensors.
//!
//! FLAMIA rotates Q and K with `H = H_d / sqrt(d)` (d = 64 or 128) before quantising; `H` is
//! symmetric and orthogonal, so `S = Q K^T` is unchanged in exact arithmetic and the backward
//! returns `dQ = H dQ_rot`, `dK = H dK_rot` with the same routine.
//!
//! Bit-level contract (binary32, round to nearest even, no FMA, no reassociation):
//! 1. Butterfly stages with half-width `h = 1, 2, 4, ..., d/2`, in that order. In stage `h`, for
//!    every `j` with `j & h == 0`: `(x[j], x[j+h]) <- (x[j] + x[j+h], x[j] - x[j+h])`.
//!    (Pairs within a stage are independent, so any thread mapping gives the same bits as long
//!    as the stages run in this order.)
//! 2. Normalisation: one multiply of every element by the binary32 constant [`norm_factor`]:
//!    `1/8 = 0x3E000000` for d = 64 and `RN(1/sqrt(128)) = 0x3DB504F3` for d = 128.

use crate::error::{Error, Result};

/// The normalisation constant multiplied into every output element (binary32 bits in the docs).
pub fn norm_factor(d: usize) -> Result<f32> {
    match d {
        64 => Ok(f32::from_bits(0x3E00_0000)),
        128 => Ok(f32::from_bits(0x3DB5_04F3)),
        _ => Err(Error::Invalid(format!(
            "Hadamard size {d} is not supported; allowed: 64, 128"
        ))),
    }
}

/// Rotates one vector of length 64 or 128 in place (the contract above).
pub fn fwht_normalized(x: &mut [f32]) -> Result<()> {
    let d = x.len();
    let c = norm_factor(d)?;
    let mut h = 1;
    while h < d {
        for i in (0..d).step_by(2 * h) {
            for j in i..i + h {
                let a = x[j];
                let b = x[j + h];
                x[j] = a + b;
                x[j + h] = a - b;
            }
        }
        h *= 2;
    }
    for v in x.iter_mut() {
        *v *= c;
    }
    Ok(())
}

/// Rotates every `head_dim`-long row of a `(tokens, heads, head_dim)` tensor, returning a copy.
pub fn rotate_rows(x: &[f32], head_dim: usize) -> Result<Vec<f32>> {
    norm_factor(head_dim)?;
    let mut out = x.to_vec();
    for row in out.chunks_exact_mut(head_dim) {
        fwht_normalized(row)?;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Naive f64 normalised Hadamard: `H[i][j] = (-1)^popcount(i & j) / sqrt(d)`.
    fn naive(x: &[f32]) -> Vec<f64> {
        let d = x.len();
        (0..d)
            .map(|i| {
                (0..d)
                    .map(|j| {
                        if (i & j).count_ones() % 2 == 0 {
                            x[j] as f64
                        } else {
                            -(x[j] as f64)
                        }
                    })
                    .sum::<f64>()
                    / (d as f64).sqrt()
            })
            .collect()
    }

    #[test]
    fn matches_naive_and_is_an_involution() {
        for d in [64usize, 128] {
            let x: Vec<f32> = (0..d)
                .map(|i| ((i * 37 % 23) as f32 - 11.0) * 0.37 + (i as f32).sin())
                .collect();
            let mut y = x.clone();
            fwht_normalized(&mut y).unwrap();
            for (a, b) in y.iter().zip(naive(&x)) {
                assert!((*a as f64 - b).abs() < 1e-5 * (1.0 + b.abs()), "{a} vs {b}");
            }
            fwht_normalized(&mut y).unwrap();
            for (a, b) in y.iter().zip(&x) {
                assert!((a - b).abs() < 1e-5 * (1.0 + b.abs()), "round trip {a} vs {b}");
            }
        }
    }

    #[test]
    fn norm_constants_are_the_documented_bits() {
        assert_eq!(norm_factor(64).unwrap(), 0.125);
        assert_eq!(norm_factor(128).unwrap(), (1.0f64 / 128f64.sqrt()) as f32);
        assert!(norm_factor(96).is_err());
    }
}
