//! Reduction of scalar training metrics across ranks. Metrics are packed by name into one small
//! f32 vector (names sorted, so every rank packs the same order), summed with one collective
//! (NCCL on the GPU, or [`crate::group::Store::mean_across_ranks`] on the CPU) and unpacked as
//! means. Packing checks that every rank reports the same names: a rank with a different set
//! would silently mix metrics.

use std::collections::BTreeMap;

use crate::error::{DistError, Result};

/// Named scalar metrics of one step on one rank.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Metrics(pub BTreeMap<String, f64>);

impl Metrics {
    pub fn insert(&mut self, name: &str, value: f64) {
        self.0.insert(name.to_string(), value);
    }

    /// Values in name order plus a fingerprint of the names (appended as the last element, so a
    /// rank with other names produces a different sum that [`Metrics::unpack_mean`] detects).
    pub fn pack(&self) -> Vec<f32> {
        let mut v: Vec<f32> = self.0.values().map(|&x| x as f32).collect();
        v.push(self.fingerprint());
        v
    }

    fn fingerprint(&self) -> f32 {
        // FNV-1a of the names, folded to an integer that f32 represents exactly.
        let mut h: u32 = 0x811c_9dc5;
        for b in self.0.keys().flat_map(|k| k.bytes().chain(std::iter::once(0))) {
            h = (h ^ b as u32).wrapping_mul(0x0100_0193);
        }
        (h % (1 << 20)) as f32
    }

    /// Means from the element-wise *sum* over `world_size` ranks of [`Metrics::pack`].
    pub fn unpack_mean(&self, summed: &[f32], world_size: usize) -> Result<Metrics> {
        let n = self.0.len();
        if summed.len() != n + 1 {
            return Err(DistError::Layout(format!(
                "{} reduced metric values for {} names",
                summed.len(),
                n + 1
            )));
        }
        let w = world_size as f32;
        if (summed[n] / w - self.fingerprint()).abs() > 0.5 {
            return Err(DistError::Layout(
                "ranks reduced different metric names; every rank must report the same metrics each step"
                    .into(),
            ));
        }
        Ok(Metrics(
            self.0
                .keys()
                .cloned()
                .zip(summed[..n].iter().map(|&s| (s / w) as f64))
                .collect(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pack_sum_unpack_gives_means() {
        let mk = |loss: f64, tps: f64| {
            let mut m = Metrics::default();
            m.insert("loss", loss);
            m.insert("tps", tps);
            m
        };
        let ranks = [mk(2.0, 100.0), mk(4.0, 300.0)];
        let mut sum = vec![0.0f32; 3];
        for r in &ranks {
            sum.iter_mut().zip(r.pack()).for_each(|(s, v)| *s += v);
        }
        let mean = ranks[0].unpack_mean(&sum, 2).unwrap();
        assert_eq!(mean.0["loss"], 3.0);
        assert_eq!(mean.0["tps"], 200.0);

        let mut other = Metrics::default();
        other.insert("loss", 2.0);
        other.insert("grad_norm", 100.0);
        let mut sum = ranks[0].pack();
        sum.iter_mut().zip(other.pack()).for_each(|(s, v)| *s += v);
        assert!(ranks[0].unpack_mean(&sum, 2).is_err());
    }
}
