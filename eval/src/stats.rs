//! Bootstrap confidence intervals for accuracies and paired differences between two models
//! scored on the same examples (deterministic: the resampling RNG is seeded, ChaCha8), and
//! Welch's t interval for a difference of means over independent runs (seeds), and a paired t
//! interval for per-seed differences.

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

/// Mean, sample standard deviation and count of a set of runs' values.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Spread {
    pub mean: f64,
    /// Sample standard deviation (n - 1); NaN for one value.
    pub sd: f64,
    pub n: usize,
}

/// [`Spread`] of `xs` (NaN mean when empty).
pub fn spread(xs: &[f64]) -> Spread {
    let n = xs.len();
    let mean = xs.iter().sum::<f64>() / n as f64;
    let sd = if n < 2 {
        f64::NAN
    } else {
        (xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1) as f64).sqrt()
    };
    Spread { mean, sd, n }
}

/// Difference of means `b - a` with a 95% Welch t interval (unequal variances, Welch–Satterthwaite
/// degrees of freedom). `None` unless both sides have at least 2 values. Equal values on both
/// sides (zero spread) give a point interval.
pub fn welch_diff(a: &[f64], b: &[f64]) -> Option<Estimate> {
    let (sa, sb) = (spread(a), spread(b));
    if sa.n < 2 || sb.n < 2 {
        return None;
    }
    let mean = sb.mean - sa.mean;
    let (va, vb) = (sa.sd * sa.sd / sa.n as f64, sb.sd * sb.sd / sb.n as f64);
    let se = (va + vb).sqrt();
    if se == 0.0 {
        return Some(Estimate {
            mean,
            lo: mean,
            hi: mean,
        });
    }
    let df = (va + vb).powi(2) / (va * va / (sa.n - 1) as f64 + vb * vb / (sb.n - 1) as f64);
    let half = t_quantile(0.975, df) * se;
    Some(Estimate {
        mean,
        lo: mean - half,
        hi: mean + half,
    })
}

/// Mean of paired differences (`d[i]` = one seed's arm value − the same seed's control value)
/// with a 95% paired t interval (n − 1 degrees of freedom). `None` with fewer than 2 pairs. Equal
/// differences give a point interval.
pub fn paired_t(diffs: &[f64]) -> Option<Estimate> {
    let s = spread(diffs);
    if s.n < 2 {
        return None;
    }
    let se = s.sd / (s.n as f64).sqrt();
    if se == 0.0 {
        return Some(Estimate {
            mean: s.mean,
            lo: s.mean,
            hi: s.mean,
        });
    }
    let half = t_quantile(0.975, (s.n - 1) as f64) * se;
    Some(Estimate {
        mean: s.mean,
        lo: s.mean - half,
        hi: s.mean + half,
    })
}

/// ln Γ(x) for x > 0 (Lanczos, g = 7, 9 terms; ~1e-15 relative).
fn ln_gamma(x: f64) -> f64 {
    const C: [f64; 9] = [
        0.999_999_999_999_809_9,
        676.520_368_121_885_1,
        -1_259.139_216_722_402_8,
        771.323_428_777_653_1,
        -176.615_029_162_140_6,
        12.507_343_278_686_905,
        -0.138_571_095_265_720_12,
        9.984_369_578_019_572e-6,
        1.505_632_735_149_311_6e-7,
    ];
    if x < 0.5 {
        return (std::f64::consts::PI / (std::f64::consts::PI * x).sin()).ln() - ln_gamma(1.0 - x);
    }
    let x = x - 1.0;
    let mut a = C[0];
    let t = x + 7.5;
    for (i, &c) in C.iter().enumerate().skip(1) {
        a += c / (x + i as f64);
    }
    0.5 * (2.0 * std::f64::consts::PI).ln() + (x + 0.5) * t.ln() - t + a.ln()
}

/// Regularised incomplete beta I_x(a, b) (continued fraction, Numerical Recipes' `betacf`).
fn inc_beta(x: f64, a: f64, b: f64) -> f64 {
    if x <= 0.0 {
        return 0.0;
    }
    if x >= 1.0 {
        return 1.0;
    }
    let front = (ln_gamma(a + b) - ln_gamma(a) - ln_gamma(b) + a * x.ln() + b * (1.0 - x).ln()).exp();
    if x > (a + 1.0) / (a + b + 2.0) {
        return 1.0 - inc_beta(1.0 - x, b, a);
    }
    let tiny = 1e-300;
    let (mut c, mut d) = (1.0, 1.0 - (a + b) * x / (a + 1.0));
    if d.abs() < tiny {
        d = tiny;
    }
    d = 1.0 / d;
    let mut h = d;
    for m in 1..300 {
        let m = m as f64;
        let num = m * (b - m) * x / ((a + 2.0 * m - 1.0) * (a + 2.0 * m));
        for (k, num) in [
            num,
            -(a + m) * (a + b + m) * x / ((a + 2.0 * m) * (a + 2.0 * m + 1.0)),
        ]
        .into_iter()
        .enumerate()
        {
            d = 1.0 + num * d;
            if d.abs() < tiny {
                d = tiny;
            }
            c = 1.0 + num / c;
            if c.abs() < tiny {
                c = tiny;
            }
            d = 1.0 / d;
            let del = c * d;
            h *= del;
            if k == 1 && (del - 1.0).abs() < 1e-15 {
                return front * h / a;
            }
        }
    }
    front * h / a
}

/// CDF of Student's t with `df` (possibly fractional) degrees of freedom.
pub fn t_cdf(t: f64, df: f64) -> f64 {
    let tail = 0.5 * inc_beta(df / (df + t * t), df / 2.0, 0.5);
    if t >= 0.0 {
        1.0 - tail
    } else {
        tail
    }
}

/// Quantile `p` (in (0.5, 1)) of Student's t with `df` degrees of freedom, by bisection.
pub fn t_quantile(p: f64, df: f64) -> f64 {
    let (mut lo, mut hi) = (0.0f64, 1e6f64);
    for _ in 0..200 {
        let mid = 0.5 * (lo + hi);
        if t_cdf(mid, df) < p {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    0.5 * (lo + hi)
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
    fn t_quantiles_match_tables() {
        // Student t tables for df = 1, 2, 4, 30; df = 3.5 from Simpson integration of the t density
        // in Python (independent of this code).
        for (df, want) in [
            (1.0, 12.706_204_736),
            (2.0, 4.302_652_730),
            (4.0, 2.776_445_105),
            (30.0, 2.042_272_456),
            (3.5, 2.940_088_638),
        ] {
            let got = t_quantile(0.975, df);
            assert!((got - want).abs() < 1e-6 * want, "df {df}: {got} vs {want}");
        }
    }

    #[test]
    fn welch_interval_matches_scipy() {
        // a = [1.47, 1.48, 1.475], b = [1.49, 1.485, 1.495]: equal spreads, so Welch df = 4 and
        // the interval is 0.015 -+ 2.7764451 * sqrt(2 * 0.005^2 / 3) = [0.0036652, 0.0263348]
        // (computed in Python from the t density).
        let a = [1.47, 1.48, 1.475];
        let b = [1.49, 1.485, 1.495];
        let d = welch_diff(&a, &b).unwrap();
        assert!((d.mean - 0.015).abs() < 1e-12);
        assert!(
            (d.lo - 0.003_665_21).abs() < 1e-7 && (d.hi - 0.026_334_79).abs() < 1e-7,
            "{d:?}"
        );
        assert!(welch_diff(&a[..1], &b).is_none());
        let same = welch_diff(&[2.0, 2.0], &[3.0, 3.0]).unwrap();
        assert_eq!((same.lo, same.hi), (1.0, 1.0));
        let s = spread(&a);
        assert!((s.sd - 0.005).abs() < 1e-12 && s.n == 3);
    }

    #[test]
    fn paired_t_interval_matches_tables() {
        // Differences 1, 2, 3: mean 2, sd 1, standard error 1/sqrt(3); the half width is
        // t(0.975, 2) = 4.3026527 (tables) / sqrt(3) = 2.4841377.
        let d = paired_t(&[1.0, 2.0, 3.0]).unwrap();
        assert!((d.mean - 2.0).abs() < 1e-12);
        assert!(
            (d.lo + 0.484_137_7).abs() < 1e-6 && (d.hi - 4.484_137_7).abs() < 1e-6,
            "{d:?}"
        );
        assert!(paired_t(&[1.0]).is_none());
        let same = paired_t(&[0.5, 0.5]).unwrap();
        assert_eq!((same.lo, same.hi), (0.5, 0.5));
    }

    #[test]
    fn quantile_interpolates_like_numpy() {
        // numpy.quantile([1, 2, 3, 4], 0.25) == 1.75
        assert!((quantile(&[1.0, 2.0, 3.0, 4.0], 0.25) - 1.75).abs() < 1e-12);
    }
}
