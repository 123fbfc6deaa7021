//! Gradient bucketing for data parallelism. Parameters are grouped into buckets of about
//! `bucket_bytes` (25 MiB by default, PyTorch DDP's default) in *reverse registration order*:
//! backward produces the last layers' gradients first, so the first bucket is ready earliest.
//! Each bucket is one flat 1-D buffer in the reduction dtype (f32 or bf16); a parameter occupies
//! `[offset, offset + numel)` of it, offsets aligned to [`ALIGN_ELEMS`] elements, and the bucket
//! length is padded to a multiple of `ALIGN_ELEMS * pad_multiple` (pass the world size so that a
//! reduce-scatter can split every bucket evenly for ZeRO-1). Padding is zero.
//!
//! The plan is pure index math; [`BucketPlan::flatten`] / [`BucketPlan::unflatten`] do the copies
//! on CPU slices (the reference and the tests). On the GPU the trainer performs the same copies
//! with tensor `narrow`/`copy_` at the offsets given here, then hands the flat buffer to NCCL.

use half::bf16;
use serde::{Deserialize, Serialize};

use crate::error::{DistError, Result};

/// PyTorch DDP's default bucket size.
pub const DEFAULT_BUCKET_BYTES: usize = 25 * 1024 * 1024;

/// Offsets inside a bucket are multiples of this many elements (256 bytes in f32): keeps every
/// parameter's slice aligned for vectorised copies and NCCL.
pub const ALIGN_ELEMS: usize = 64;

/// Precision of the gradient all-reduce.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum ReduceDtype {
    /// Exact sums of f32 gradients (default).
    #[default]
    F32,
    /// Half the bytes on the wire; NCCL sums in bf16, so with many ranks the mean loses about
    /// `log2(world_size)` bits on top of bf16's 8-bit mantissa.
    Bf16,
    /// The per-step metrics (loss mean, ZeRO-1's gradient-norm parts): f64 so that a mean over
    /// one rank is the value itself. Not a gradient setting (`FromStr` does not accept it).
    F64,
}

impl ReduceDtype {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            ReduceDtype::F32 => 4,
            ReduceDtype::Bf16 => 2,
            ReduceDtype::F64 => 8,
        }
    }
}

impl std::str::FromStr for ReduceDtype {
    type Err = DistError;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "f32" | "fp32" | "float32" => Ok(ReduceDtype::F32),
            "bf16" | "bfloat16" => Ok(ReduceDtype::Bf16),
            _ => Err(DistError::Layout(format!(
                "unknown reduce dtype {s:?}; allowed: f32, bf16"
            ))),
        }
    }
}

/// One parameter's place in a bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Slot {
    /// Index of the parameter in registration order.
    pub param: usize,
    /// First element in the bucket's flat buffer.
    pub offset: usize,
    /// Number of elements.
    pub numel: usize,
}

/// A group of parameters reduced with one collective.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Bucket {
    /// Parameters, in the order their gradients become ready (reverse registration).
    pub slots: Vec<Slot>,
    /// Length of the flat buffer in elements, padding included.
    pub numel: usize,
}

/// Element types a flat bucket can hold.
pub trait FlatElem: Copy + Default {
    fn from_f32(x: f32) -> Self;
    fn to_f32(self) -> f32;
}
impl FlatElem for f32 {
    fn from_f32(x: f32) -> Self {
        x
    }
    fn to_f32(self) -> f32 {
        self
    }
}
impl FlatElem for bf16 {
    fn from_f32(x: f32) -> Self {
        bf16::from_f32(x)
    }
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }
}

/// The bucket layout for one model.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BucketPlan {
    pub buckets: Vec<Bucket>,
    pub dtype: ReduceDtype,
    /// `(bucket, slot)` of every parameter, by registration index.
    pub locate: Vec<(usize, usize)>,
}

fn round_up(x: usize, m: usize) -> usize {
    x.div_ceil(m) * m
}

impl BucketPlan {
    /// Plan buckets for parameters with `numels` (registration order). `bucket_bytes` caps a
    /// bucket (a single larger parameter gets a bucket of its own); `pad_multiple` (>= 1, usually
    /// the world size) makes every bucket length divisible by `ALIGN_ELEMS * pad_multiple`.
    pub fn new(
        numels: &[usize],
        bucket_bytes: usize,
        dtype: ReduceDtype,
        pad_multiple: usize,
    ) -> Result<Self> {
        let reverse: Vec<usize> = (0..numels.len()).rev().collect();
        Self::in_order(numels, &reverse, bucket_bytes, dtype, pad_multiple)
    }

    /// [`BucketPlan::new`] with the parameters filled in `order` (a permutation of the
    /// registration indices), e.g. the order in which the backward produces the gradients:
    /// bucket 0 then holds the first gradients ready.
    pub fn in_order(
        numels: &[usize],
        order: &[usize],
        bucket_bytes: usize,
        dtype: ReduceDtype,
        pad_multiple: usize,
    ) -> Result<Self> {
        let mut seen = vec![false; numels.len()];
        for &p in order {
            if p >= numels.len() || std::mem::replace(&mut seen[p], true) {
                return Err(DistError::Layout(format!(
                    "bucket order {order:?} is not a permutation of 0..{}",
                    numels.len()
                )));
            }
        }
        if order.len() != numels.len() {
            return Err(DistError::Layout(format!(
                "bucket order has {} parameters, the model {}",
                order.len(),
                numels.len()
            )));
        }
        if bucket_bytes == 0 || pad_multiple == 0 {
            return Err(DistError::Layout(format!(
                "bucket_bytes ({bucket_bytes}) and pad_multiple ({pad_multiple}) must be at least 1"
            )));
        }
        if let Some(i) = numels.iter().position(|&n| n == 0) {
            return Err(DistError::Layout(format!("parameter {i} has no elements")));
        }
        let cap = (bucket_bytes / dtype.size()).max(1);
        let mut buckets = Vec::new();
        let mut cur: Vec<Slot> = Vec::new();
        let mut used = 0usize;
        for &param in order {
            let numel = numels[param];
            let start = round_up(used, ALIGN_ELEMS);
            if !cur.is_empty() && start + numel > cap {
                buckets.push(std::mem::take(&mut cur));
                used = 0;
            }
            let offset = round_up(used, ALIGN_ELEMS);
            cur.push(Slot { param, offset, numel });
            used = offset + numel;
        }
        if !cur.is_empty() {
            buckets.push(cur);
        }
        let pad = ALIGN_ELEMS * pad_multiple;
        let buckets: Vec<Bucket> = buckets
            .into_iter()
            .map(|slots| {
                let end = slots.last().map(|s| s.offset + s.numel).unwrap_or(0);
                Bucket {
                    numel: round_up(end, pad),
                    slots,
                }
            })
            .collect();
        let mut locate = vec![(0, 0); numels.len()];
        for (b, bucket) in buckets.iter().enumerate() {
            for (s, slot) in bucket.slots.iter().enumerate() {
                locate[slot.param] = (b, s);
            }
        }
        Ok(BucketPlan {
            buckets,
            dtype,
            locate,
        })
    }

    /// Number of parameters planned.
    pub fn num_params(&self) -> usize {
        self.locate.len()
    }

    /// Total elements of all flat buffers (padding included).
    pub fn total_numel(&self) -> usize {
        self.buckets.iter().map(|b| b.numel).sum()
    }

    fn check_grads(&self, b: usize, lens: impl Iterator<Item = usize>, flat_len: usize) -> Result<&Bucket> {
        let bucket = self.buckets.get(b).ok_or_else(|| {
            DistError::Layout(format!(
                "bucket {b} does not exist ({} buckets)",
                self.buckets.len()
            ))
        })?;
        let lens: Vec<usize> = lens.collect();
        if lens.len() != self.num_params() {
            return Err(DistError::Layout(format!(
                "{} gradient buffers given, the plan has {} parameters",
                lens.len(),
                self.num_params()
            )));
        }
        for s in &bucket.slots {
            if lens[s.param] != s.numel {
                return Err(DistError::Layout(format!(
                    "parameter {} has {} gradient elements, planned {}",
                    s.param, lens[s.param], s.numel
                )));
            }
        }
        if flat_len != bucket.numel {
            return Err(DistError::Layout(format!(
                "flat buffer has {flat_len} elements, bucket {b} needs {}",
                bucket.numel
            )));
        }
        Ok(bucket)
    }

    /// Copy bucket `b`'s gradients (indexed by parameter) into `flat`, converting to `T`; padding
    /// is zeroed.
    pub fn flatten<T: FlatElem>(&self, b: usize, grads: &[&[f32]], flat: &mut [T]) -> Result<()> {
        let bucket = self.check_grads(b, grads.iter().map(|g| g.len()), flat.len())?;
        flat.fill(T::default());
        for s in &bucket.slots {
            for (d, &g) in flat[s.offset..s.offset + s.numel].iter_mut().zip(grads[s.param]) {
                *d = T::from_f32(g);
            }
        }
        Ok(())
    }

    /// Copy bucket `b`'s flat (reduced) buffer back into the gradients, multiplied by `scale`
    /// (e.g. `1 / world_size` after a sum; 1 after an average).
    pub fn unflatten<T: FlatElem>(
        &self,
        b: usize,
        flat: &[T],
        grads: &mut [&mut [f32]],
        scale: f32,
    ) -> Result<()> {
        let bucket = self.check_grads(b, grads.iter().map(|g| g.len()), flat.len())?;
        for s in &bucket.slots {
            for (g, &v) in grads[s.param].iter_mut().zip(&flat[s.offset..s.offset + s.numel]) {
                *g = v.to_f32() * scale;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    fn random_grads(numels: &[usize], seed: u64) -> Vec<Vec<f32>> {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        numels
            .iter()
            .map(|&n| (0..n).map(|_| rng.random_range(-3.0f32..3.0)).collect())
            .collect()
    }

    #[test]
    fn a_given_order_fills_the_buckets_in_that_order_and_bad_orders_are_refused() {
        let numels = [1000, 7, 300_000, 64, 4097, 1, 250_000];
        let order = [3, 0, 6, 1, 5, 2, 4];
        let plan = BucketPlan::in_order(&numels, &order, 4096, ReduceDtype::F32, 2).unwrap();
        let got: Vec<usize> = plan
            .buckets
            .iter()
            .flat_map(|b| b.slots.iter().map(|s| s.param))
            .collect();
        assert_eq!(got, order);
        for (p, &(b, s)) in plan.locate.iter().enumerate() {
            assert_eq!(plan.buckets[b].slots[s].param, p);
        }
        for bad in [&[0, 1, 2][..], &[3, 0, 6, 1, 5, 2, 2], &[3, 0, 6, 1, 5, 2, 9]] {
            assert!(BucketPlan::in_order(&numels, bad, 4096, ReduceDtype::F32, 2).is_err());
        }
    }

    #[test]
    fn plan_covers_every_parameter_once_in_reverse_order() {
        let numels = [1000, 7, 300_000, 64, 4097, 1, 250_000];
        for (bytes, ws) in [(1 << 20, 1), (4096, 3), (DEFAULT_BUCKET_BYTES, 8), (1, 2)] {
            for dtype in [ReduceDtype::F32, ReduceDtype::Bf16] {
                let plan = BucketPlan::new(&numels, bytes, dtype, ws).unwrap();
                let order: Vec<usize> = plan
                    .buckets
                    .iter()
                    .flat_map(|b| b.slots.iter().map(|s| s.param))
                    .collect();
                assert_eq!(order, (0..numels.len()).rev().collect::<Vec<_>>());
                for b in &plan.buckets {
                    assert_eq!(b.numel % (ALIGN_ELEMS * ws), 0);
                    let mut end = 0;
                    for s in &b.slots {
                        assert!(
                            s.offset >= end && s.offset % ALIGN_ELEMS == 0,
                            "overlap or misaligned"
                        );
                        end = s.offset + s.numel;
                    }
                    assert!(end <= b.numel);
                    // A bucket over the cap holds exactly one (large) parameter.
                    if end * dtype.size() > bytes {
                        assert_eq!(b.slots.len(), 1);
                    }
                }
                for (p, &(b, s)) in plan.locate.iter().enumerate() {
                    assert_eq!(plan.buckets[b].slots[s].param, p);
                }
            }
        }
    }

    #[test]
    fn f32_round_trip_is_exact_and_bf16_within_rounding() {
        let numels = [513, 64, 10_000, 3, 777];
        let grads = random_grads(&numels, 7);
        let refs: Vec<&[f32]> = grads.iter().map(|g| g.as_slice()).collect();
        let plan = BucketPlan::new(&numels, 8 * 1024, ReduceDtype::F32, 4).unwrap();
        assert!(plan.buckets.len() > 1, "test should span several buckets");
        let mut out: Vec<Vec<f32>> = numels.iter().map(|&n| vec![f32::NAN; n]).collect();
        for b in 0..plan.buckets.len() {
            let mut flat = vec![1.0f32; plan.buckets[b].numel];
            plan.flatten(b, &refs, &mut flat).unwrap();
            let used: usize = plan.buckets[b].slots.iter().map(|s| s.numel).sum();
            assert_eq!(
                flat.iter().filter(|v| **v != 0.0).count(),
                used,
                "padding must be zero"
            );
            let mut outs: Vec<&mut [f32]> = out.iter_mut().map(|g| g.as_mut_slice()).collect();
            plan.unflatten(b, &flat, &mut outs, 1.0).unwrap();
        }
        assert_eq!(out, grads);

        let plan = BucketPlan::new(&numels, 8 * 1024, ReduceDtype::Bf16, 1).unwrap();
        let mut out: Vec<Vec<f32>> = numels.iter().map(|&n| vec![f32::NAN; n]).collect();
        for b in 0..plan.buckets.len() {
            let mut flat = vec![bf16::ZERO; plan.buckets[b].numel];
            plan.flatten(b, &refs, &mut flat).unwrap();
            let mut outs: Vec<&mut [f32]> = out.iter_mut().map(|g| g.as_mut_slice()).collect();
            plan.unflatten(b, &flat, &mut outs, 1.0).unwrap();
        }
        for (o, g) in out.iter().flatten().zip(grads.iter().flatten()) {
            assert!((o - g).abs() <= g.abs() * 2f32.powi(-8), "{o} vs {g}");
        }
    }

    #[test]
    fn simulated_all_reduce_mean_matches_direct_mean() {
        // Three ranks, sum of flat buckets then unflatten with 1/W == elementwise mean.
        let numels = [100, 2000, 33];
        let ranks: Vec<Vec<Vec<f32>>> = (0..3).map(|r| random_grads(&numels, 100 + r)).collect();
        let plan = BucketPlan::new(&numels, 4096, ReduceDtype::F32, 3).unwrap();
        let mut out: Vec<Vec<f32>> = numels.iter().map(|&n| vec![0.0; n]).collect();
        for b in 0..plan.buckets.len() {
            let mut sum = vec![0.0f32; plan.buckets[b].numel];
            for g in &ranks {
                let refs: Vec<&[f32]> = g.iter().map(|x| x.as_slice()).collect();
                let mut flat = vec![0.0f32; plan.buckets[b].numel];
                plan.flatten(b, &refs, &mut flat).unwrap();
                sum.iter_mut().zip(&flat).for_each(|(s, f)| *s += f);
            }
            let mut outs: Vec<&mut [f32]> = out.iter_mut().map(|g| g.as_mut_slice()).collect();
            plan.unflatten(b, &sum, &mut outs, 1.0 / 3.0).unwrap();
        }
        for p in 0..numels.len() {
            for i in 0..numels[p] {
                let mean = (ranks[0][p][i] + ranks[1][p][i] + ranks[2][p][i]) / 3.0;
                assert!((out[p][i] - mean).abs() < 1e-6);
            }
        }
    }

    #[test]
    fn mismatched_buffers_are_errors() {
        let plan = BucketPlan::new(&[10, 20], 1 << 20, ReduceDtype::F32, 1).unwrap();
        let a = vec![0.0f32; 10];
        let b = vec![0.0f32; 21];
        let mut flat = vec![0.0f32; plan.buckets[0].numel];
        assert!(plan.flatten(0, &[&a, &b], &mut flat).is_err());
        assert!(plan.flatten(0, &[&a], &mut flat).is_err());
        assert!(plan.flatten(5, &[&a, &b[..20]], &mut flat).is_err());
        assert!(plan.flatten(0, &[&a, &b[..20]], &mut flat[..3]).is_err());
        assert!(BucketPlan::new(&[0], 10, ReduceDtype::F32, 1).is_err());
        assert!("fp8".parse::<ReduceDtype>().is_err());
    }
}
