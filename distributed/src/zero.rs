//! ZeRO-1 partition math: the optimiser state of a flat buffer (one gradient bucket, or all
//! parameters laid out as in [`crate::bucket::BucketPlan`]) is split into `world_size` equal,
//! contiguous shards; rank `r` owns `[r * shard, (r + 1) * shard)`. A step is then
//! reduce-scatter(gradients, avg) -> each rank updates only its shard of the parameters with its
//! shard of the optimiser state -> all-gather(parameters). The flat length must be a multiple of
//! the world size (`BucketPlan::new(.., pad_multiple = world_size)` guarantees it); padding
//! elements belong to the last shards and carry no parameter.

use std::ops::Range;

use crate::bucket::Slot;
use crate::error::{DistError, Result};

/// Shards of one flat buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ZeroPartition {
    /// Length of the flat buffer (padding included).
    pub numel: usize,
    pub world_size: usize,
    /// Elements per shard (`numel / world_size`).
    pub shard: usize,
}

/// The part of one parameter that lies in one rank's shard.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Segment {
    /// Parameter index (registration order).
    pub param: usize,
    /// Elements of the parameter (flattened) covered.
    pub in_param: Range<usize>,
    /// The same elements as positions inside the shard (`0..shard`).
    pub in_shard: Range<usize>,
}

impl ZeroPartition {
    /// Partition a flat buffer of `numel` elements across `world_size` ranks.
    pub fn new(numel: usize, world_size: usize) -> Result<Self> {
        if world_size == 0 || !numel.is_multiple_of(world_size) {
            return Err(DistError::Layout(format!(
                "flat buffer of {numel} elements cannot be split evenly over {world_size} ranks; \
                 pad it to a multiple of the world size (BucketPlan pad_multiple = world size)"
            )));
        }
        Ok(ZeroPartition {
            numel,
            world_size,
            shard: numel / world_size,
        })
    }

    /// Range of the flat buffer owned by `rank`.
    pub fn shard_range(&self, rank: usize) -> Range<usize> {
        rank * self.shard..(rank + 1) * self.shard
    }

    /// Pieces of the parameters in `slots` (a bucket's layout) that fall in `rank`'s shard.
    pub fn segments(&self, slots: &[Slot], rank: usize) -> Vec<Segment> {
        let own = self.shard_range(rank);
        slots
            .iter()
            .filter_map(|s| {
                let lo = s.offset.max(own.start);
                let hi = (s.offset + s.numel).min(own.end);
                (lo < hi).then(|| Segment {
                    param: s.param,
                    in_param: lo - s.offset..hi - s.offset,
                    in_shard: lo - own.start..hi - own.start,
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bucket::{BucketPlan, ReduceDtype};
    use rand::{Rng, SeedableRng};

    const NUMELS: [usize; 9] = [4096, 11, 1, 70_000, 513, 64, 3, 9999, 128];

    #[test]
    fn shards_are_disjoint_and_cover_every_parameter_element() {
        for ws in [1, 2, 3, 4, 5, 7, 8, 16, 64] {
            let plan = BucketPlan::new(&NUMELS, 64 * 1024, ReduceDtype::F32, ws).unwrap();
            let mut seen: Vec<Vec<u8>> = NUMELS.iter().map(|&n| vec![0u8; n]).collect();
            for bucket in &plan.buckets {
                let part = ZeroPartition::new(bucket.numel, ws).unwrap();
                let mut covered = 0;
                for r in 0..ws {
                    let range = part.shard_range(r);
                    assert_eq!(range.start, covered, "ws {ws}: shards must tile the buffer");
                    covered = range.end;
                    for seg in part.segments(&bucket.slots, r) {
                        assert_eq!(seg.in_param.len(), seg.in_shard.len());
                        assert!(seg.in_shard.end <= part.shard);
                        for i in seg.in_param.clone() {
                            seen[seg.param][i] += 1;
                        }
                    }
                }
                assert_eq!(covered, bucket.numel);
            }
            assert!(
                seen.iter().flatten().all(|&c| c == 1),
                "ws {ws}: every element owned exactly once"
            );
        }
        assert!(ZeroPartition::new(10, 3).is_err());
        assert!(ZeroPartition::new(10, 0).is_err());
    }

    /// Adam-like elementwise update with per-element state (what the optimiser shards).
    fn update(p: &mut f32, g: f32, m: &mut f32, v: &mut f32) {
        *m = 0.9 * *m + 0.1 * g;
        *v = 0.99 * *v + 0.01 * g * g;
        *p -= 1e-2 * *m / (v.sqrt() + 1e-8);
    }

    #[test]
    fn sharded_step_equals_replicated_step() {
        // Simulate reduce-scatter -> shard update -> all-gather on CPU and compare with every rank
        // doing the full (replicated) update on the all-reduced gradient.
        for ws in [1, 2, 3, 5, 8] {
            let mut rng = rand::rngs::StdRng::seed_from_u64(ws as u64);
            let plan = BucketPlan::new(&NUMELS, 32 * 1024, ReduceDtype::F32, ws).unwrap();
            let params: Vec<Vec<f32>> = NUMELS
                .iter()
                .map(|&n| (0..n).map(|_| rng.random_range(-1.0..1.0)).collect())
                .collect();
            let grads: Vec<Vec<Vec<f32>>> = (0..ws)
                .map(|_| {
                    NUMELS
                        .iter()
                        .map(|&n| (0..n).map(|_| rng.random_range(-1.0..1.0)).collect())
                        .collect()
                })
                .collect();
            // Replicated reference.
            let mut reference = params.clone();
            for p in 0..NUMELS.len() {
                for i in 0..NUMELS[p] {
                    let g = (0..ws).map(|r| grads[r][p][i]).sum::<f32>() / ws as f32;
                    let (mut m, mut v) = (0.0, 0.0);
                    update(&mut reference[p][i], g, &mut m, &mut v);
                }
            }
            // Sharded.
            let mut result = params.clone();
            for (b, bucket) in plan.buckets.iter().enumerate() {
                let part = ZeroPartition::new(bucket.numel, ws).unwrap();
                let flats: Vec<Vec<f32>> = (0..ws)
                    .map(|r| {
                        let refs: Vec<&[f32]> = grads[r].iter().map(|g| g.as_slice()).collect();
                        let mut f = vec![0.0; bucket.numel];
                        plan.flatten(b, &refs, &mut f).unwrap();
                        f
                    })
                    .collect();
                let prefs: Vec<&[f32]> = params.iter().map(|g| g.as_slice()).collect();
                let mut flat_params = vec![0.0; bucket.numel];
                plan.flatten(b, &prefs, &mut flat_params).unwrap();
                let mut gathered = vec![f32::NAN; bucket.numel];
                for r in 0..ws {
                    let own = part.shard_range(r);
                    // reduce-scatter (avg): this rank receives only its shard of the mean.
                    let g_shard: Vec<f32> = own
                        .clone()
                        .map(|i| flats.iter().map(|f| f[i]).sum::<f32>() / ws as f32)
                        .collect();
                    let mut p_shard = flat_params[own.clone()].to_vec();
                    let (mut m, mut v) = (vec![0.0; part.shard], vec![0.0; part.shard]);
                    for seg in part.segments(&bucket.slots, r) {
                        for i in seg.in_shard {
                            update(&mut p_shard[i], g_shard[i], &mut m[i], &mut v[i]);
                        }
                    }
                    gathered[own].copy_from_slice(&p_shard); // all-gather
                }
                let mut outs: Vec<&mut [f32]> = result.iter_mut().map(|g| g.as_mut_slice()).collect();
                plan.unflatten(b, &gathered, &mut outs, 1.0).unwrap();
            }
            for (a, b) in result.iter().flatten().zip(reference.iter().flatten()) {
                assert!((a - b).abs() <= 1e-6, "ws {ws}: {a} vs {b}");
            }
        }
    }
}
