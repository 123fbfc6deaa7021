//! Bootstrap confidence intervals for accuracies and paired differences between two models
//! scored on the same examples. Deterministic: the resampling RNG is seeded (ChaCha8).

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

/// Bootstrap resamples used by reports.
pub const RESAMPLES: usize = 2000;
/// Seed of every bootstrap in reports (fixed so reports are reproducible).
pub const SEED: u64 = 0x00f1_a31a;

/// A mean with its 95% percentile-bootstrap interval.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Estimate {
    pub mean: f64,
    pub lo: f64,
    pub hi: f64,
}

/// Mean of `xs` and the 2.5% / 97.5% quantiles of the means of `resamples` bootstrap resamples.
/// An empty input gives NaNs.
pub fn bootstrap_mean(xs: &[f64], resamples: usize, seed: u64) -> Estimate {
    bootstrap(xs.len(), resamples, seed, |i| xs[i])
}

/// Paired bootstrap of `b - a` over the same examples (`a[i]` and `b[i]` are the same example
/// scored by two models): resamples example indices and takes the mean difference.
/// Panics if the lengths differ (callers check the examples match first).
pub fn paired_diff(a: &[f64], b: &[f64], resamples: usize, seed: u64) -> Estimate {
    assert_eq!(
        a.len(),
        b.len(),
        "paired bootstrap needs the same examples on both sides"
    );
    bootstrap(a.len(), resamples, seed, |i| b[i] - a[i])
}

fn bootstrap(n: usize, resamples: usize, seed: u64, value: impl Fn(usize) -> f64) -> Estimate {
    if n == 0 {
        return Estimate {
            mean: f64::NAN,
            lo: f64::NAN,
            hi: f64::NAN,
        };
    }
    let mean = (0..n).map(&value).sum::<f64>() / n as f64;
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut means: Vec<f64> = (0..resamples.max(1))
        .map(|_| (0..n).map(|_| value(rng.random_range(0..n))).sum::<f64>() / n as f64)
        .collect();
    means.sort_by(f64::total_cmp);
    Estimate {
        mean,
        lo: quantile(&means, 0.025),
        hi: quantile(&means, 0.975),
    }
}

/// Quantile of sorted data with linear interpolation (numpy's default).
pub fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let pos = q.clamp(0.0, 1.0) * (sorted.len() - 1) as f64;
    let lo = pos.floor() as usize;
    let hi = pos.ceil() as usize;
    sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - lo as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constant_data_has_a_point_interval() {
        let e = bootstrap_mean(&[1.0; 50], 200, 1);
        assert_eq!((e.mean, e.lo, e.hi), (1.0, 1.0, 1.0));
        let d = paired_diff(&[1.0; 10], &[0.0; 10], 200, 1);
        assert_eq!((d.mean, d.lo, d.hi), (-1.0, -1.0, -1.0));
    }

    #[test]
    fn interval_covers_mean_and_matches_binomial_width() {
        // 1000 examples at accuracy 0.3: the normal-approximation 95% half width is
        // 1.96 * sqrt(0.3 * 0.7 / 1000) = 0.0284; the bootstrap must agree within ~15%.
        let xs: Vec<f64> = (0..1000).map(|i| if i % 10 < 3 { 1.0 } else { 0.0 }).collect();
        let e = bootstrap_mean(&xs, RESAMPLES, SEED);
        assert!((e.mean - 0.3).abs() < 1e-12);
        assert!(e.lo < e.mean && e.mean < e.hi);
        let half = (e.hi - e.lo) / 2.0;
        assert!((half - 0.0284).abs() < 0.0284 * 0.15, "half width {half}");
    }

    #[test]
    fn pairing_removes_shared_variance() {
        // b is a plus one extra correct answer out of 400: unpaired intervals overlap almost
        // entirely, the paired difference is tight around 1/400.
        let a: Vec<f64> = (0..400).map(|i| f64::from(i % 2 == 0)).collect();
        let mut b = a.clone();
        b[1] = 1.0;
        let d = paired_diff(&a, &b, RESAMPLES, SEED);
        assert!((d.mean - 0.0025).abs() < 1e-12);
        assert!(d.lo >= 0.0 && d.hi <= 0.0101, "{d:?}");
    }

    #[test]
    fn quantile_interpolates_like_numpy() {
        // numpy.quantile([1, 2, 3, 4], 0.25) == 1.75
        assert!((quantile(&[1.0, 2.0, 3.0, 4.0], 0.25) - 1.75).abs() < 1e-12);
    }
}
