//! Data parallelism for the training loop (owned by the distributed engineer; the loop calls it
//! as `docs/distributed.md` describes). One process per GPU: [`Ddp::from_env`] joins the process
//! group from the launcher's variables (torchrun / Slurm / single process), creates the NCCL
//! communicator on `cuda:<local rank>`, [`Ddp::attach`] lays the parameters' gradients out in
//! ~25 MiB buckets (reverse order) and makes every replica start from rank 0's weights, and
//! [`Ddp::all_reduce_grads`] averages gradients after backward: per bucket, flatten (`narrow` +
//! `copy_`, converting to the reduction dtype) -> `ncclAllReduce(avg)` in place -> copy back. All
//! of it runs on the legacy default CUDA stream, the one libtorch uses, so it is ordered with the
//! backward and the optimiser without extra synchronisation. No call waits on the host except
//! [`Ddp::mean`] (the step's one metric round trip, which the loop needs on the host anyway): it
//! polls the stream and NCCL's asynchronous error against the timeout, so a dead peer gives an
//! error there, not a hang; the gradient reduction and the ZeRO-1 all-gather only check NCCL's
//! error state (session 6: each host wait cost the step its queue, 2-4% at world size 1).
//!
//! With `distributed.overlap` the reduction overlaps the backward instead: [`crate::overlap`]
//! sets a post-accumulate-grad hook on every parameter (through the C++ bridge), buckets the
//! gradients in the order the backward produces them and launches each bucket's reduction as
//! soon as its gradients are final (NCCL on a side stream); [`Ddp::begin_backward`] tells it
//! which micro-batch is the step's last. On CPU with several ranks (tests, debugging)
//! gradients go through rank 0's TCP store instead of NCCL: correct, slow, for tiny models only.
//! A single process without launcher variables makes every call a no-op.
//!
//! At world size 1 through a launcher every per-step collective is an identity (the average
//! over one rank is the value itself): by default [`Ddp`] skips them (the gradient reduction,
//! its packing copies and hooks, the ZeRO-1 parameter all-gather, the metric mean) and says so
//! once at start-up; the start-up collectives (rendezvous, agreement, weight broadcast) still
//! run. `distributed.force_collectives = true` runs them anyway, so the NCCL path can be
//! exercised on one GPU. The numbers are the same either way (bitwise).

use std::sync::Arc;
use std::time::Duration;

use cudarc::driver::CudaContext;
use flamia_dist::bucket::{BucketPlan, ReduceDtype, DEFAULT_BUCKET_BYTES};
use flamia_dist::nccl::{CommOptions, Communicator, NcclId, ReduceOp};
use flamia_dist::{GroupOptions, ProcessGroup, Source, Topology};
use tch::{Device, Kind, Tensor};

use crate::error::{Result, TrainError};
use crate::overlap::{mean_of_ranks, Backend, Reducer, ReducerOptions};

/// Stream of every NCCL call: the legacy default stream (libtorch's default).
const STREAM: *mut std::ffi::c_void = std::ptr::null_mut();

fn dist<E: std::fmt::Display>(e: E) -> TrainError {
    TrainError::Invalid(format!("distributed: {e}"))
}

/// Data-parallel settings.
#[derive(Debug, Clone)]
pub struct DdpOptions {
    /// Bucket size in bytes (of the reduction dtype).
    pub bucket_bytes: usize,
    /// Precision of the gradient all-reduce.
    pub reduce_dtype: ReduceDtype,
    /// A collective of a training step not finished after this is a hang: abort and fail.
    pub collective_timeout: Duration,
    /// Start-up: joining (the group's join timeout), the agreement check, the weight broadcast.
    pub startup_timeout: Duration,
    /// Waits on rank 0's checkpoint I/O (its reading of the checkpoint to resume from, the
    /// gather before a checkpoint, the final barrier).
    pub checkpoint_timeout: Duration,
    /// Reduce gradient buckets during the backward (per-parameter hooks), not after it.
    pub overlap: bool,
    /// Run the per-step collectives at world size 1 too (they are identities; skipped unless set).
    pub force_collectives: bool,
}

impl Default for DdpOptions {
    fn default() -> Self {
        DdpOptions {
            bucket_bytes: DEFAULT_BUCKET_BYTES,
            reduce_dtype: ReduceDtype::F32,
            collective_timeout: Duration::from_secs(300),
            startup_timeout: Duration::from_secs(900),
            checkpoint_timeout: Duration::from_secs(1800),
            overlap: false,
            force_collectives: false,
        }
    }
}

impl DdpOptions {
    /// The options and group options of a `[distributed]` config section; the
    /// `FLAMIA_DIST_JOIN_TIMEOUT_S` / `FLAMIA_DIST_HEARTBEAT_TIMEOUT_S` / `FLAMIA_DIST_EXIT_GRACE_S`
    /// variables still override the group's when set.
    pub fn from_config(c: &crate::config::DistributedConfig) -> Result<(DdpOptions, GroupOptions)> {
        let secs = Duration::from_secs_f64;
        let opts = DdpOptions {
            bucket_bytes: ((c.bucket_mib * (1u64 << 20) as f64) as usize).max(1),
            reduce_dtype: c.reduce_dtype.parse().map_err(dist)?,
            collective_timeout: secs(c.collective_timeout_s),
            startup_timeout: secs(c.startup_timeout_s),
            checkpoint_timeout: secs(c.checkpoint_timeout_s),
            overlap: c.overlap,
            force_collectives: c.force_collectives,
        };
        let defaults = GroupOptions::default();
        let group = GroupOptions {
            join_timeout: opts.startup_timeout,
            heartbeat_timeout: secs(c.heartbeat_timeout_s),
            heartbeat_interval: defaults.heartbeat_interval.min(secs(c.heartbeat_timeout_s / 4.0)),
            ..defaults
        }
        .with_env()
        .map_err(dist)?;
        Ok((opts, group))
    }
}

/// This process's data-parallel state.
pub struct Ddp {
    topo: Topology,
    opts: DdpOptions,
    pg: Option<ProcessGroup>,
    comm: Option<Arc<Communicator>>,
    _ctx: Option<Arc<CudaContext>>,
    plan: Option<BucketPlan>,
    params: Vec<Tensor>,
    flats: Vec<Tensor>,
    overlap: Option<Arc<Reducer>>,
    /// The last gradient reduction averaged only this rank's ZeRO-1 range.
    sharded: bool,
    /// World size 1 through a launcher without `force_collectives`: the per-step collectives
    /// are identities and are skipped.
    identity: bool,
}

impl std::fmt::Debug for Ddp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ddp").field("topo", &self.topo).finish()
    }
}

impl Ddp {
    /// Join the group described by the environment. `cuda`: the run trains on a GPU (then NCCL
    /// is used and `cuda:<local rank>` becomes this thread's current device).
    pub fn from_env(opts: DdpOptions, gopts: &GroupOptions, cuda: bool) -> Result<Ddp> {
        let topo = Topology::from_env().map_err(dist)?;
        Self::with_topology(topo, gopts, opts, cuda)
    }

    /// [`Ddp::from_env`] with an explicit placement and group options (tests, custom launchers).
    pub fn with_topology(topo: Topology, gopts: &GroupOptions, opts: DdpOptions, cuda: bool) -> Result<Ddp> {
        let mut ddp = Ddp {
            topo,
            opts,
            pg: None,
            comm: None,
            _ctx: None,
            plan: None,
            params: Vec::new(),
            flats: Vec::new(),
            overlap: None,
            sharded: false,
            identity: false,
        };
        if ddp.topo.world_size == 1 && ddp.topo.source == Source::Single {
            return Ok(ddp);
        }
        let pg = ProcessGroup::join(&ddp.topo, gopts, || {
            if cuda {
                NcclId::new().map(|id| id.0.to_vec())
            } else {
                Ok(vec![0u8; 128])
            }
        })
        .map_err(dist)?;
        if cuda {
            // NCCL takes the current device; tch only sets it inside its own calls.
            let ctx = CudaContext::new(ddp.topo.device)
                .map_err(|e| dist(format!("cuda:{}: {e:?}", ddp.topo.device)))?;
            ctx.bind_to_thread().map_err(|e| dist(format!("{e:?}")))?;
            let id = NcclId::from_bytes(pg.payload()).map_err(dist)?;
            let copts = CommOptions {
                timeout: ddp.opts.collective_timeout,
                ..CommOptions::default()
            };
            let comm = Communicator::new(
                &id,
                ddp.topo.rank,
                ddp.topo.world_size,
                copts,
                Some(pg.health().clone()),
            )
            .map_err(dist)?;
            ddp.comm = Some(comm);
            ddp._ctx = Some(ctx);
        }
        tracing::info!(
            "data parallel: rank {} of {} (local rank {}, device {}, from {:?}), hosts {:?}",
            ddp.topo.rank,
            ddp.topo.world_size,
            ddp.topo.local_rank,
            ddp.topo.device,
            ddp.topo.source,
            pg.hosts()
        );
        ddp.pg = Some(pg);
        ddp.identity = ddp.topo.world_size == 1 && !ddp.opts.force_collectives;
        if ddp.identity {
            tracing::info!(
                "data parallel: world size 1: the per-step collectives (gradient reduction, ZeRO-1 \
                 all-gather, metric mean) are identities and are skipped; \
                 distributed.force_collectives = true runs them"
            );
        }
        Ok(ddp)
    }

    pub fn rank(&self) -> usize {
        self.topo.rank
    }
    pub fn world_size(&self) -> usize {
        self.topo.world_size
    }
    /// Rank 0: the one that logs, writes checkpoints and summaries.
    pub fn is_main(&self) -> bool {
        self.topo.rank == 0
    }

    /// The device this rank must train on: `cuda:<local rank>` for CUDA runs, else `requested`.
    pub fn device(&self, requested: Device) -> Device {
        match requested {
            Device::Cuda(_) if self.pg.is_some() => Device::Cuda(self.topo.device),
            d => d,
        }
    }

    /// Plan gradient buckets for `params` (the optimiser's order) and copy rank 0's weights to
    /// every rank. Call once, after the model is built (and restored from a checkpoint). With
    /// `overlap` the parameters get gradient hooks instead (their gradients must be updated in
    /// place, as AdamW's flat-buffer views are) and the buckets are planned after the first
    /// backward, in its order.
    pub fn attach(&mut self, params: &[(String, Tensor)]) -> Result<()> {
        let Some(pg) = &self.pg else {
            return Ok(());
        };
        if self.identity {
            // no buckets, no hooks: only the start-up copy of rank 0's weights (itself)
            let params: Vec<Tensor> = params.iter().map(|(_, p)| p.shallow_clone()).collect();
            return self.broadcast(&params);
        }
        if self.opts.overlap {
            let backend = match (&self.comm, &self._ctx) {
                (Some(comm), Some(ctx)) => Backend::Nccl {
                    comm: comm.clone(),
                    ctx: ctx.clone(),
                },
                _ => Backend::Store(pg.shared_store()),
            };
            let tensors: Vec<Tensor> = params.iter().map(|(_, p)| p.shallow_clone()).collect();
            let opts = ReducerOptions {
                bucket_bytes: self.opts.bucket_bytes,
                dtype: self.opts.reduce_dtype,
                world: self.topo.world_size,
                rank: self.topo.rank,
                timeout: self.opts.collective_timeout,
            };
            self.overlap = Some(Reducer::attach(&tensors, backend, opts)?);
            return self.broadcast(&tensors);
        }
        let numels: Vec<usize> = params.iter().map(|(_, p)| p.numel()).collect();
        let plan = BucketPlan::new(
            &numels,
            self.opts.bucket_bytes,
            self.opts.reduce_dtype,
            self.topo.world_size,
        )
        .map_err(dist)?;
        let device = params.first().map(|(_, p)| p.device()).unwrap_or(Device::Cpu);
        let kind = match self.opts.reduce_dtype {
            ReduceDtype::F32 => Kind::Float,
            ReduceDtype::Bf16 => Kind::BFloat16,
            ReduceDtype::F64 => Kind::Double,
        };
        self.flats = plan
            .buckets
            .iter()
            .map(|b| Tensor::zeros([b.numel as i64], (kind, device)))
            .collect();
        self.params = params.iter().map(|(_, p)| p.shallow_clone()).collect();
        self.plan = Some(plan);
        let params: Vec<Tensor> = self.params.iter().map(|p| p.shallow_clone()).collect();
        self.broadcast(&params)
    }

    /// Copy rank 0's values of `tensors` (f32, in place) to every rank: NCCL broadcast, or on
    /// CPU through the store. Collective. Used for the weights ([`Ddp::attach`]) and, on resume,
    /// for the optimizer moments that only rank 0 read from the checkpoint.
    pub fn broadcast(&self, tensors: &[Tensor]) -> Result<()> {
        let Some(pg) = &self.pg else {
            return Ok(());
        };
        let _guard = tch::no_grad_guard();
        for p in tensors {
            let mut flat = p.f_detach()?.f_to_kind(Kind::Float)?.f_contiguous()?;
            if let Some(comm) = &self.comm {
                let ptr = flat.data_ptr() as u64;
                // SAFETY: `flat` is a contiguous f32 device tensor of `numel` elements that lives
                // until the wait below.
                unsafe { comm.broadcast(ptr, ptr, flat.numel(), ReduceDtype::F32, 0, STREAM) }
                    .map_err(dist)?;
                comm.wait(STREAM, "broadcast").map_err(dist)?;
            } else {
                let root = if self.is_main() {
                    let mine: Vec<f32> = Vec::try_from(&flat.f_view([-1])?)?;
                    Some(mine.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>())
                } else {
                    None
                };
                let bytes = pg
                    .store()
                    .broadcast(root.as_deref(), self.opts.startup_timeout)
                    .map_err(dist)?;
                let root: Vec<f32> = bytes
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .collect();
                flat = Tensor::from_slice(&root).f_view(flat.size().as_slice())?;
            }
            let mut dst = p.f_detach()?;
            dst.f_copy_(&flat)?;
        }
        Ok(())
    }

    /// ZeRO-1: the range of a flat buffer of `n` elements this rank owns: contiguous shards of
    /// `ceil(n / world size)` elements in rank order (the last ones shorter or empty).
    pub fn zero_range(&self, n: i64) -> std::ops::Range<i64> {
        let w = self.topo.world_size as i64;
        let shard = (n + w - 1) / w;
        let r = self.topo.rank as i64;
        (r * shard).min(n)..((r + 1) * shard).min(n)
    }

    /// ZeRO-1: the full flat f32 buffer of `n` elements from every rank's [`Ddp::zero_range`]
    /// part (`part` is this rank's: `zero_range(n).len()` elements). Collective: NCCL all-gather
    /// over equal padded shards, or on CPU through the store.
    pub fn gather_ranges(&self, part: &Tensor, n: i64) -> Result<Tensor> {
        let _guard = tch::no_grad_guard();
        let own = self.zero_range(n);
        let Some(pg) = self.pg.as_ref().filter(|_| !self.identity) else {
            return Ok(part.f_detach()?);
        };
        let w = self.topo.world_size as i64;
        let shard = (n + w - 1) / w;
        if let Some(comm) = &self.comm {
            // (not zeroed: past `own` a rank's block is padding, only ever read past `n`)
            let buf = Tensor::f_empty([shard * w], (Kind::Float, part.device()))?;
            let r = self.topo.rank as i64;
            buf.f_narrow(0, r * shard, own.end - own.start)?.f_copy_(part)?;
            self.all_gather_blocks(comm, &buf, shard)?;
            Ok(buf.f_narrow(0, 0, n)?)
        } else {
            let mine: Vec<f32> = Vec::try_from(&part.f_to_kind(Kind::Float)?)?;
            let bytes: Vec<u8> = mine.iter().flat_map(|v| v.to_le_bytes()).collect();
            let all = pg
                .store()
                .all_gather(&bytes, self.opts.collective_timeout)
                .map_err(dist)?;
            let full: Vec<f32> = all
                .iter()
                .flat_map(|b| b.chunks_exact(4))
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect();
            if full.len() as i64 != n {
                return Err(dist(format!(
                    "ZeRO-1 all-gather: {} elements from the ranks, {n} expected",
                    full.len()
                )));
            }
            Ok(Tensor::from_slice(&full).f_to_device(part.device())?)
        }
    }

    /// NCCL's in-place all-gather in `buf` (`world * shard` contiguous f32 on this device, alive
    /// until the compute stream has passed it): every rank's block `r * shard..` from rank `r`.
    /// On the compute stream, so the caller's reads and libtorch's reuse of the memory queue
    /// behind it; no host wait (errors surface at the next step's metric mean).
    fn all_gather_blocks(&self, comm: &Communicator, buf: &Tensor, shard: i64) -> Result<()> {
        let ptr = buf.data_ptr() as u64;
        let r = self.topo.rank as i64;
        // SAFETY: as documented above; the send range is this rank's block of `buf`.
        unsafe {
            comm.all_gather(
                ptr + (r * shard * 4) as u64,
                ptr,
                shard as usize,
                ReduceDtype::F32,
                STREAM,
            )
        }
        .map_err(dist)?;
        comm.check_async().map_err(dist)
    }

    /// ZeRO-1 after the update: `flat` (the flat f32 parameter buffer, `n` elements, of which
    /// this rank updated its [`Ddp::zero_range`]) gets every other rank's range, in place.
    /// Collective. With NCCL and `n` a multiple of the world size it is NCCL's in-place
    /// all-gather on `flat` itself (no buffer, no copy); otherwise [`Ddp::gather_ranges`] into a
    /// padded buffer, copied back. Nothing to do for a single process or at world size 1
    /// without `force_collectives`.
    pub fn all_gather_in_place(&self, flat: &Tensor) -> Result<()> {
        if self.pg.is_none() || self.identity {
            return self.check();
        }
        let _guard = tch::no_grad_guard();
        let n = flat.numel() as i64;
        let w = self.topo.world_size as i64;
        if let Some(comm) = &self.comm {
            if n % w == 0 && flat.kind() == Kind::Float && flat.is_contiguous() {
                // (the optimiser's buffer: behind the update that wrote this rank's block, ahead
                // of the next forward, all on the compute stream)
                return self.all_gather_blocks(comm, flat, n / w);
            }
        }
        let own = self.zero_range(n);
        let part = flat.f_narrow(0, own.start, own.end - own.start)?;
        let full = self.gather_ranges(&part, n)?;
        flat.shallow_clone().f_copy_(&full)?;
        Ok(())
    }

    /// Rank 0's `value` on every rank (the others pass `None`): e.g. which checkpoint rank 0
    /// chose to resume from. Waits up to the checkpoint I/O timeout (rank 0 may be reading).
    pub fn broadcast_bytes(&self, value: Option<&[u8]>) -> Result<Vec<u8>> {
        match &self.pg {
            Some(pg) => pg
                .store()
                .broadcast(value, self.opts.checkpoint_timeout)
                .map_err(dist),
            None => value
                .map(<[u8]>::to_vec)
                .ok_or_else(|| TrainError::Invalid("broadcast_bytes: a single process is rank 0".into())),
        }
    }

    /// Start-up agreement: every rank must have the same value of each named item, else every
    /// rank fails with an error naming the item, the ranks and the first differing line.
    pub fn agree(&self, items: &[(&str, String)]) -> Result<()> {
        match &self.pg {
            Some(pg) => pg
                .store()
                .agree(items, self.opts.startup_timeout)
                .map_err(|e| TrainError::Invalid(e.to_string())),
            None => Ok(()),
        }
    }

    /// Call before each micro-batch's backward; `last`: the step's last micro-batch (its
    /// gradients are final, so overlapped reductions may start). A no-op without `overlap`.
    pub fn begin_backward(&self, last: bool) {
        if let Some(r) = &self.overlap {
            r.begin_backward(last);
        }
    }

    /// Average every parameter's gradient across ranks (in place). Call after the last backward
    /// of the step (after gradient accumulation), before the gradient norm / clipping / AdamW.
    /// With `overlap`, waits for the reductions the backward started and does the rest.
    pub fn all_reduce_grads(&mut self) -> Result<()> {
        if let (Some(pg), Some(r)) = (&self.pg, &self.overlap) {
            pg.health().check().map_err(dist)?;
            self.sharded = r.finish(pg.store())?;
            return Ok(());
        }
        let (Some(pg), Some(plan)) = (&self.pg, &self.plan) else {
            // (also world size 1 without `force_collectives`: `attach` planned nothing)
            return self.check();
        };
        pg.health().check().map_err(dist)?;
        let _guard = tch::no_grad_guard();
        let grads: Vec<Tensor> = self.params.iter().map(|p| p.grad()).collect();
        for (b, bucket) in plan.buckets.iter().enumerate() {
            let flat = &mut self.flats[b];
            let _ = flat.zero_();
            for s in &bucket.slots {
                let g = &grads[s.param];
                if g.defined() {
                    let mut dst = flat.narrow(0, s.offset as i64, s.numel as i64);
                    dst.copy_(&g.view([-1]));
                }
            }
            if let Some(comm) = &self.comm {
                let ptr = flat.data_ptr() as u64;
                // SAFETY: `flat` is a contiguous device tensor of `bucket.numel` elements of the
                // reduction dtype; it lives in `self.flats` beyond the wait at the end.
                unsafe { comm.all_reduce(ptr, ptr, bucket.numel, plan.dtype, ReduceOp::Avg, STREAM) }
                    .map_err(dist)?;
            } else {
                let mine: Vec<f32> = Vec::try_from(&flat.to_kind(Kind::Float))?;
                let bytes: Vec<u8> = mine.iter().flat_map(|v| v.to_le_bytes()).collect();
                let all = pg
                    .store()
                    .all_gather(&bytes, self.opts.collective_timeout)
                    .map_err(dist)?;
                let mean = mean_of_ranks(&all);
                let reduced = Tensor::from_slice(&mean).to_kind(flat.kind());
                flat.copy_(&reduced);
            }
            for s in &bucket.slots {
                let g = &grads[s.param];
                if g.defined() {
                    let mut dst = g.view([-1]);
                    dst.copy_(&flat.narrow(0, s.offset as i64, s.numel as i64));
                }
            }
        }
        if let Some(comm) = &self.comm {
            // No host wait: the all-reduces and the copies back run on the compute stream, so
            // the optimiser's kernels queue behind them. Errors and timeouts surface at the
            // step's metric mean (`Ddp::mean`), whose wait covers this stream's work too.
            comm.check_async().map_err(dist)?;
        }
        Ok(())
    }

    /// ZeRO-1 with `overlap`: from the next plan on, reduce each element of `flat` (AdamW's flat
    /// gradient buffer, which every gradient is a view of) only to the rank whose
    /// [`Ddp::zero_range`] holds it (NCCL reduce, or a store gather to that rank), instead of
    /// to every rank. A no-op without `overlap`. After [`Ddp::all_reduce_grads`],
    /// [`Ddp::grads_sharded`] says whether it applied (then only this rank's range holds
    /// averages: the gradient norm must be combined from every rank's part).
    pub fn shard_gradients(&self, flat: &Tensor) {
        if let Some(r) = &self.overlap {
            let w = self.topo.world_size as i64;
            r.shard(flat, (flat.numel() as i64 + w - 1) / w);
        }
    }

    /// Whether the last [`Ddp::all_reduce_grads`] averaged only this rank's ZeRO-1 range.
    pub fn grads_sharded(&self) -> bool {
        self.sharded
    }

    /// Mean of each value across ranks (every rank gets the same numbers). Use it for the loss
    /// *before* any decision that must agree across ranks (skipping a step, stopping).
    pub fn mean(&self, values: &[f64]) -> Result<Vec<f64>> {
        let Some(pg) = self.pg.as_ref().filter(|_| !self.identity) else {
            self.check()?;
            return Ok(values.to_vec());
        };
        if let Some(comm) = &self.comm {
            // f64 on the wire: the mean over one rank is the value itself (in f32 the ZeRO-1
            // gradient norm, sent squared, came back a last bit off and moved the clip factor:
            // zero1 + overlap losses left the plain run's at step 12 of the H200 check)
            let t = Tensor::from_slice(values).to_device(Device::Cuda(self.topo.device));
            let ptr = t.data_ptr() as u64;
            // SAFETY: `t` holds `values.len()` f64 on this device until the wait.
            unsafe { comm.all_reduce(ptr, ptr, values.len(), ReduceDtype::F64, ReduceOp::Avg, STREAM) }
                .map_err(dist)?;
            comm.wait(STREAM, "metric all-reduce").map_err(dist)?;
            Ok(Vec::<f64>::try_from(&t.to_device(Device::Cpu))?)
        } else {
            pg.store()
                .mean_across_ranks(values, self.opts.collective_timeout)
                .map_err(dist)
        }
    }

    /// Every rank's bytes (by rank), e.g. each rank's serialised `DataState` for rank 0's
    /// checkpoint. Collective: every rank must call it. Waits up to the checkpoint I/O timeout
    /// (rank 0 may first be finishing the previous checkpoint's write).
    pub fn gather(&self, bytes: &[u8]) -> Result<Vec<Vec<u8>>> {
        match &self.pg {
            Some(pg) => pg
                .store()
                .all_gather(bytes, self.opts.checkpoint_timeout)
                .map_err(dist),
            None => Ok(vec![bytes.to_vec()]),
        }
    }

    /// Every rank waits here for the others, up to the checkpoint I/O timeout: after rank 0 wrote
    /// a checkpoint in the foreground, so that the others do not wait for it in the next step's
    /// collectives, whose timeout is shorter.
    pub fn checkpoint_barrier(&self) -> Result<()> {
        match &self.pg {
            Some(pg) => pg.store().barrier(self.opts.checkpoint_timeout).map_err(dist),
            None => Ok(()),
        }
    }

    /// `Err` once another rank has failed (call once per step; cheap).
    pub fn check(&self) -> Result<()> {
        match &self.pg {
            Some(pg) => pg.health().check().map_err(dist),
            None => Ok(()),
        }
    }

    /// The group's first recorded failure (a peer's death, error or hang), if any.
    pub fn group_failure(&self) -> Option<String> {
        self.pg.as_ref().and_then(|pg| pg.health().failure())
    }

    /// Tell every rank this one is failing (they stop with `reason` instead of timing out).
    pub fn fail(&self, reason: &str) {
        if let Some(pg) = &self.pg {
            pg.fail(reason);
        }
    }

    /// Wait for every rank at the end of training, then leave the group.
    pub fn shutdown(mut self) -> Result<()> {
        if let Some(r) = self.overlap.take() {
            r.close();
        }
        self.comm = None;
        match self.pg.take() {
            Some(pg) => pg.shutdown(self.opts.checkpoint_timeout).map_err(dist),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flamia_dist::Source;

    fn topo(rank: usize, world: usize, port: u16) -> Topology {
        Topology {
            rank,
            world_size: world,
            local_rank: rank,
            local_world_size: None,
            master_addr: "127.0.0.1".into(),
            master_port: port,
            source: Source::Torchrun,
            device: rank,
        }
    }

    fn gopts() -> GroupOptions {
        GroupOptions {
            join_timeout: Duration::from_secs(30),
            exit_grace: None,
            ..GroupOptions::default()
        }
    }

    /// Two parameters with gradients `(rank + 1) * base`.
    fn params_with_grads(rank: usize, device: Device) -> Vec<(String, Tensor)> {
        let a = (Tensor::arange(6, (Kind::Float, device)).view([2, 3]) * (rank as f64 + 1.0))
            .set_requires_grad(true);
        let b = (Tensor::ones([5], (Kind::Float, device)) * (10.0 * rank as f64)).set_requires_grad(true);
        let loss = (&a * (rank as f64 + 1.0)).sum(Kind::Float) + (&b * &b).sum(Kind::Float);
        loss.backward();
        vec![("a".into(), a), ("b".into(), b)]
    }

    fn free_port() -> u16 {
        std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    }

    /// `body(ddp, rank)` on two CPU ranks (threads, store path), then shutdown.
    fn on_two_cpu_ranks(opts: DdpOptions, body: fn(&mut Ddp, usize)) {
        let port = free_port();
        let ranks: Vec<_> = (0..2)
            .map(|rank| {
                let opts = opts.clone();
                std::thread::spawn(move || {
                    let mut ddp = Ddp::with_topology(topo(rank, 2, port), &gopts(), opts, false).unwrap();
                    body(&mut ddp, rank);
                    ddp.shutdown().unwrap();
                })
            })
            .collect();
        for r in ranks {
            r.join().unwrap();
        }
    }

    #[test]
    fn cpu_ranks_average_gradients_and_start_from_rank0_weights() {
        let opts = DdpOptions {
            bucket_bytes: 64,
            ..DdpOptions::default()
        };
        on_two_cpu_ranks(opts, |ddp, rank| {
            assert_eq!(ddp.device(Device::Cpu), Device::Cpu);
            let params = params_with_grads(rank, Device::Cpu);
            let b_before: Vec<f32> = Vec::try_from(&params[1].1.detach()).unwrap();
            ddp.attach(&params).unwrap();
            assert!(
                ddp.plan.as_ref().unwrap().buckets.len() == 2,
                "64-byte buckets: one per param"
            );
            // Weights now equal rank 0's.
            let a: Vec<f32> = Vec::try_from(&params[0].1.detach().view([-1])).unwrap();
            assert_eq!(a, vec![0.0, 1.0, 2.0, 3.0, 4.0, 5.0]);
            let b: Vec<f32> = Vec::try_from(&params[1].1.detach()).unwrap();
            assert_eq!(b, vec![0.0; 5], "rank {rank} had {b_before:?}");
            // Gradients: d/da = rank + 1 -> mean 1.5; d/db = 2 * 10 * rank -> mean 10.
            ddp.all_reduce_grads().unwrap();
            let ga: Vec<f32> = Vec::try_from(&params[0].1.grad().view([-1])).unwrap();
            assert_eq!(ga, vec![1.5; 6]);
            let gb: Vec<f32> = Vec::try_from(&params[1].1.grad()).unwrap();
            assert_eq!(gb, vec![10.0; 5]);
            assert_eq!(ddp.mean(&[rank as f64, 4.0]).unwrap(), vec![0.5, 4.0]);
            let all = ddp.gather(&[rank as u8]).unwrap();
            assert_eq!(all, vec![vec![0], vec![1]]);
            ddp.check().unwrap();
        });
    }

    /// Three steps of the overlapped reduction (the first records the backward's order): the
    /// gradients of `(step + 1) * (rank + 1) * sum(a) + sum(b * b)` (b = rank 0's ones after
    /// attach) averaged over `world` ranks, step by step.
    fn overlapped_steps(ddp: &mut Ddp, rank: usize, world: usize, device: Device) {
        let a = Tensor::zeros([2, 3], (Kind::Float, device)).set_requires_grad(true);
        let b = (Tensor::ones([70], (Kind::Float, device)) * (rank as f64 + 1.0)).set_requires_grad(true);
        let params = vec![
            ("a".to_string(), a.shallow_clone()),
            ("b".to_string(), b.shallow_clone()),
        ];
        ddp.attach(&params).unwrap();
        let mean_rank = (1..=world).sum::<usize>() as f64 / world as f64;
        for step in 0..3 {
            for micro in 0..2 {
                ddp.begin_backward(micro == 1);
                let loss = (&a * ((step + 1) as f64 * (rank as f64 + 1.0))).sum(Kind::Float)
                    + (&b * &b).sum(Kind::Float) * 0.5;
                loss.backward();
            }
            ddp.all_reduce_grads().unwrap();
            let ga: Vec<f32> = Vec::try_from(&a.grad().view([-1]).to_device(Device::Cpu)).unwrap();
            let want = (2 * (step + 1)) as f64 * mean_rank;
            assert_eq!(ga, vec![want as f32; 6], "rank {rank} step {step}");
            let gb: Vec<f32> = Vec::try_from(&b.grad().to_device(Device::Cpu)).unwrap();
            assert_eq!(gb, vec![2.0; 70], "rank {rank} step {step}: 2 micro-batches of b");
            tch::no_grad(|| {
                let _ = a.grad().zero_();
                let _ = b.grad().zero_();
            });
        }
    }

    #[test]
    fn cpu_ranks_reduce_overlapped_with_the_backward() {
        let opts = DdpOptions {
            bucket_bytes: 64,
            overlap: true,
            ..DdpOptions::default()
        };
        on_two_cpu_ranks(opts, |ddp, rank| overlapped_steps(ddp, rank, 2, Device::Cpu));
    }

    #[test]
    fn single_process_without_launcher_is_a_no_op() {
        let mut ddp = Ddp::with_topology(Topology::single(), &gopts(), DdpOptions::default(), false).unwrap();
        let params = params_with_grads(1, Device::Cpu);
        ddp.attach(&params).unwrap();
        ddp.all_reduce_grads().unwrap();
        let ga: Vec<f32> = Vec::try_from(&params[0].1.grad().view([-1])).unwrap();
        assert_eq!(ga, vec![2.0; 6]);
        assert_eq!(ddp.mean(&[3.0]).unwrap(), vec![3.0]);
        assert!(ddp.is_main());
    }

    /// World size 1 through the launcher without `force_collectives`: nothing planned, no hooks,
    /// gradients and metrics untouched; forced, the same calls go through the store.
    #[test]
    fn world_size_one_skips_the_identity_collectives_unless_forced() {
        for force in [false, true] {
            let opts = DdpOptions {
                bucket_bytes: 64,
                overlap: true,
                force_collectives: force,
                ..DdpOptions::default()
            };
            let mut ddp = Ddp::with_topology(topo(0, 1, free_port()), &gopts(), opts, false).unwrap();
            assert_eq!(ddp.identity, !force);
            let params = params_with_grads(0, Device::Cpu);
            ddp.attach(&params).unwrap();
            assert_eq!(ddp.overlap.is_some(), force, "hooks only when forced");
            if force {
                ddp.begin_backward(true);
            }
            ddp.all_reduce_grads().unwrap();
            let ga: Vec<f32> = Vec::try_from(&params[0].1.grad().view([-1])).unwrap();
            assert_eq!(ga, vec![1.0; 6]);
            assert_eq!(ddp.mean(&[0.1, 7.0]).unwrap(), vec![0.1, 7.0]);
            let flat = Tensor::arange(5, (Kind::Float, Device::Cpu));
            ddp.all_gather_in_place(&flat).unwrap();
            let back: Vec<f32> = Vec::try_from(&flat).unwrap();
            assert_eq!(back, vec![0.0, 1.0, 2.0, 3.0, 4.0]);
            ddp.shutdown().unwrap();
        }
    }

    #[test]
    #[ignore = "needs a CUDA GPU: run on the device with --ignored (libnccl.so on LD_LIBRARY_PATH: source launch/nccl-env.sh)"]
    fn one_rank_nccl_gradient_all_reduce_on_the_device() {
        // World size 1 through the launcher path: real rendezvous, real NCCL communicator (the
        // per-step collectives forced: at world size 1 they are otherwise skipped).
        let port = free_port();
        let opts = DdpOptions {
            force_collectives: true,
            ..DdpOptions::default()
        };
        let mut ddp = Ddp::with_topology(topo(0, 1, port), &gopts(), opts, true).unwrap();
        assert!(!ddp.identity);
        let device = ddp.device(Device::Cuda(0));
        let params = params_with_grads(0, device);
        ddp.attach(&params).unwrap();
        ddp.all_reduce_grads().unwrap();
        let ga: Vec<f32> = Vec::try_from(&params[0].1.grad().view([-1]).to_device(Device::Cpu)).unwrap();
        assert_eq!(ga, vec![1.0; 6]);
        assert_eq!(ddp.mean(&[2.5]).unwrap(), vec![2.5]);
        // ZeRO-1's parameter all-gather in place on the flat buffer (send = receive at 1 rank)
        let flat = Tensor::arange(10, (Kind::Float, device));
        ddp.all_gather_in_place(&flat).unwrap();
        let back: Vec<f32> = Vec::try_from(&flat.to_device(Device::Cpu)).unwrap();
        assert_eq!(back, (0..10).map(|i| i as f32).collect::<Vec<_>>());
        ddp.shutdown().unwrap();
    }

    #[test]
    #[ignore = "needs a CUDA GPU: run on the device with --ignored (libnccl.so on LD_LIBRARY_PATH: source launch/nccl-env.sh)"]
    fn one_rank_nccl_overlapped_reduction_on_the_device() {
        // The hooks on libtorch's CUDA autograd thread, the side stream and its events, NCCL
        // launched from the hook, the wait and the copy back.
        let port = free_port();
        let opts = DdpOptions {
            bucket_bytes: 64,
            overlap: true,
            force_collectives: true,
            ..DdpOptions::default()
        };
        let mut ddp = Ddp::with_topology(topo(0, 1, port), &gopts(), opts, true).unwrap();
        let device = ddp.device(Device::Cuda(0));
        overlapped_steps(&mut ddp, 0, 1, device);
        assert!(ddp.overlap.is_some(), "forced: the hooks reduce");
        ddp.shutdown().unwrap();
    }
}
