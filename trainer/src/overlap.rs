//! Gradient reduction overlapped with the backward (`distributed.overlap`), driven by
//! per-parameter autograd hooks.
//!
//! [`Reducer::attach`] sets a post-accumulate-grad hook on every parameter through the C++
//! bridge (`flamia_bridge_grad_hook` in `csrc/bridge.cpp`): the autograd engine calls it right
//! after it accumulated a gradient into the parameter's `.grad`, while the backward goes on.
//!
//! - **Recording** (the first step): the hooks of the last micro-batch count how often each
//!   parameter's gradient is accumulated (the loss head's own backward, activation checkpointing
//!   or tied weights make it more than once) and in which order the last accumulations come.
//!   After the backward, rank 0's order and counts are broadcast (every rank must bucket alike),
//!   gradients are bucketed in that order ([`BucketPlan::in_order`]) and this step is reduced
//!   after the backward.
//! - **Armed** (the last micro-batch of every later step): a parameter is ready when its count
//!   is reached; when every parameter of the next bucket in order is ready, the hook launches
//!   the bucket's reduction at once. With the f32 reduce dtype the gradients are reduced in
//!   place: the bucket's parameters sorted by gradient address make a few stretches of AdamW's
//!   flat gradient buffer, one collective each, no copy (every launch checks that no gradient
//!   moved). With bf16 (or gradients that are not contiguous f32) the hook copies the bucket
//!   into a flat buffer of the reduction dtype first, and `finish` copies the averages back. Buckets launch strictly in order (0, 1, ...), so the collectives match
//!   on every rank. An accumulation beyond the recorded count (the graph changed) is an error.
//! - Earlier micro-batches of a step (gradient accumulation) are ignored: only the last one's
//!   gradients are final.
//! - [`Reducer::finish`] (after the backward): launches what is left and waits for every
//!   bucket.
//!
//! Where the reductions run: on GPU, NCCL `all_reduce(avg)` on a non-blocking side stream
//! ([`SideStream`]) that waits for an event recorded on the stream the gradient was accumulated
//! on (libtorch's current stream in the hook), so the backward's kernels keep running while
//! NCCL works; `finish` waits for the side stream (with the collective timeout and NCCL error
//! polling) and, for flat copies, copies back on the compute stream. On CPU ranks (tests) a reducer thread runs
//! each bucket's store all-gather and averages it while the backward goes on.
//!
//! `FLAMIA_DDP_TRACE=<file>` appends one JSON line per micro-batch backward's start (`last`), per
//! bucket launch (`from` `hook` or `end`, `pending_grads`: parameters whose gradients the
//! backward had still to produce) and per step's backward end: the evidence that reductions
//! start inside the backward of the last micro-batch.

use std::ffi::{c_char, c_void};
use std::io::Write;
use std::panic::AssertUnwindSafe;
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use cudarc::driver::CudaContext;
use flamia_dist::bucket::{BucketPlan, ReduceDtype};
use flamia_dist::nccl::{Communicator, ReduceOp};
use flamia_dist::stream::SideStream;
use flamia_dist::Store;
use tch::{Kind, Tensor};

use crate::error::{Result, TrainError};

type GradReady = unsafe extern "C" fn(*mut c_void, i64, *mut c_void);
type Release = unsafe extern "C" fn(*mut c_void);

extern "C" {
    fn flamia_bridge_grad_hook(
        t: *const torch_sys::C_tensor,
        ready: GradReady,
        release: Release,
        ctx: *mut c_void,
        index: i64,
        err: *mut c_char,
        err_len: usize,
    ) -> i32;
}

fn invalid(msg: String) -> TrainError {
    TrainError::Invalid(format!("distributed: {msg}"))
}

/// Where bucket reductions run.
pub(crate) enum Backend {
    /// NCCL on a side stream.
    Nccl {
        comm: Arc<Communicator>,
        ctx: Arc<CudaContext>,
    },
    /// The rank-0 TCP store, from a reducer thread (CPU ranks).
    Store(Arc<Store>),
}

/// One bucket's work for the store reducer thread: parts of f32 bytes, each averaged on every
/// rank (`None`) or on its owner only (`Some(rank)`, ZeRO-1).
type StoreJob = (usize, Vec<(Option<usize>, Vec<u8>)>);
/// Per part the average, where this rank receives it.
type StoreResult = (usize, std::result::Result<Vec<Option<Vec<f32>>>, String>);

/// The store reducer thread's ends.
struct StoreThread {
    jobs: mpsc::Sender<StoreJob>,
    results: mpsc::Receiver<StoreResult>,
}

/// The average over ranks of `all` (each rank's f32 little-endian bytes, by rank): summed in rank
/// order, then divided by the world size (the same arithmetic whatever the bucketing).
pub(crate) fn mean_of_ranks(all: &[Vec<u8>]) -> Vec<f32> {
    let n = all.first().map_or(0, |r| r.len() / 4);
    let mut mean = vec![0f32; n];
    for r in all {
        for (m, c) in mean.iter_mut().zip(r.chunks_exact(4)) {
            *m += f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        }
    }
    let w = all.len() as f32;
    mean.iter_mut().for_each(|m| *m /= w);
    mean
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Outside a backward whose gradients are final: hooks do nothing.
    Idle,
    /// The last micro-batch of the first step: hooks record.
    Record,
    /// The last micro-batch of a later step: hooks launch buckets.
    Armed,
}

/// Parameters whose f32 gradients lie back to back in memory (AdamW's flat gradient buffer):
/// reduced in place as one stretch of `len` elements from `ptr`.
struct Run {
    ptr: u64,
    len: usize,
    params: Vec<usize>,
}

/// The plan made from the recorded step, and what it needs per step.
struct Plan {
    buckets: BucketPlan,
    /// Accumulations per parameter in one micro-batch's backward.
    expected: Vec<u32>,
    /// In place (f32): each bucket's runs, and every gradient's address (checked per launch).
    runs: Option<(Vec<Vec<Run>>, Vec<u64>)>,
    /// ZeRO-1 (in place): each bucket's stretches cut at the ranks' ranges of the flat gradient
    /// buffer, `(element offset, length, owner)`, each reduced to its owner only.
    pieces: Option<Vec<Vec<(i64, usize, usize)>>>,
    /// Otherwise (bf16, or gradients that are not contiguous f32): one flat copy per bucket.
    flats: Vec<Tensor>,
    side: Option<SideStream>,
    store: Option<StoreThread>,
}

struct State {
    params: Vec<Tensor>,
    numels: Vec<usize>,
    backend: Backend,
    bucket_bytes: usize,
    dtype: ReduceDtype,
    world: usize,
    rank: usize,
    timeout: Duration,
    phase: Phase,
    /// ZeRO-1: AdamW's flat gradient buffer and the elements per rank's range.
    shard: Option<(Tensor, i64)>,
    /// This backward's accumulations per parameter.
    fires: Vec<u32>,
    /// Recording: the parameter of every accumulation, in order.
    seq: Vec<usize>,
    plan: Option<Plan>,
    /// Armed: parameters still to become ready, per bucket and in all.
    remaining: Vec<usize>,
    pending: usize,
    /// The next bucket to launch, and how many launches wait for completion.
    next: usize,
    in_flight: usize,
    error: Option<String>,
    step: u64,
    trace: Option<std::fs::File>,
    t0: Instant,
}

/// The overlapped reducer of one rank (shared with the hooks).
pub struct Reducer {
    state: Mutex<Option<State>>,
}

impl std::fmt::Debug for Reducer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reducer").finish_non_exhaustive()
    }
}

/// Options of [`Reducer::attach`].
pub(crate) struct ReducerOptions {
    pub bucket_bytes: usize,
    pub dtype: ReduceDtype,
    pub world: usize,
    pub rank: usize,
    pub timeout: Duration,
}

unsafe extern "C" fn grad_ready(ctx: *mut c_void, index: i64, stream: *mut c_void) {
    // SAFETY: ctx is an `Arc<Reducer>` leaked for this hook (released in `release`).
    let r = unsafe { &*(ctx as *const Reducer) };
    let res = std::panic::catch_unwind(AssertUnwindSafe(|| r.on_grad(index as usize, stream)));
    if res.is_err() {
        r.record_error("a gradient hook panicked".into());
    }
}

unsafe extern "C" fn release(ctx: *mut c_void) {
    // SAFETY: the pointer came from `Arc::into_raw` in `attach`, released once per hook.
    drop(unsafe { Arc::from_raw(ctx as *const Reducer) });
}

impl Reducer {
    /// A reducer for `params` (their gradients must stay the same tensors, updated in place:
    /// AdamW's flat-buffer views) and a hook on each.
    pub(crate) fn attach(params: &[Tensor], backend: Backend, o: ReducerOptions) -> Result<Arc<Reducer>> {
        let trace = match std::env::var_os("FLAMIA_DDP_TRACE") {
            Some(p) if !p.is_empty() => Some(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&p)
                    .map_err(|e| invalid(format!("FLAMIA_DDP_TRACE={}: {e}", p.to_string_lossy())))?,
            ),
            _ => None,
        };
        let n = params.len();
        let r = Arc::new(Reducer {
            state: Mutex::new(Some(State {
                params: params.iter().map(Tensor::shallow_clone).collect(),
                numels: params.iter().map(Tensor::numel).collect(),
                backend,
                bucket_bytes: o.bucket_bytes,
                dtype: o.dtype,
                world: o.world,
                rank: o.rank,
                timeout: o.timeout,
                phase: Phase::Idle,
                shard: None,
                fires: vec![0; n],
                seq: Vec::new(),
                plan: None,
                remaining: Vec::new(),
                pending: 0,
                next: 0,
                in_flight: 0,
                error: None,
                step: 0,
                trace,
                t0: Instant::now(),
            })),
        });
        for (i, p) in params.iter().enumerate() {
            let ctx = Arc::into_raw(r.clone()) as *mut c_void;
            let mut err = [0 as c_char; 512];
            // SAFETY: `p` is a live tensor; ctx is an owned Arc handed to the hook (the bridge
            // releases it through `release` in every case); err is writable.
            let rc = unsafe {
                flamia_bridge_grad_hook(
                    p.as_ptr(),
                    grad_ready,
                    release,
                    ctx,
                    i as i64,
                    err.as_mut_ptr(),
                    err.len(),
                )
            };
            if rc != 0 {
                // SAFETY: the bridge wrote a NUL-terminated message.
                let msg = unsafe { std::ffi::CStr::from_ptr(err.as_ptr()) }.to_string_lossy();
                return Err(invalid(format!("gradient hook on parameter {i}: {msg}")));
            }
        }
        Ok(r)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<State>> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn record_error(&self, msg: String) {
        if let Some(st) = self.lock().as_mut() {
            st.error.get_or_insert(msg);
        }
    }

    /// Before each micro-batch's backward: `last` says its gradients are the step's final ones.
    pub fn begin_backward(&self, last: bool) {
        let mut g = self.lock();
        let Some(st) = g.as_mut() else { return };
        st.trace_line(format!(r#""event":"backward_begin","last":{last}"#));
        st.fires.iter_mut().for_each(|f| *f = 0);
        st.seq.clear();
        st.phase = match (last, &st.plan) {
            (false, _) => Phase::Idle,
            (true, None) => Phase::Record,
            (true, Some(plan)) => {
                st.remaining = plan
                    .buckets
                    .buckets
                    .iter()
                    .map(|b| b.slots.iter().filter(|s| plan.expected[s.param] > 0).count())
                    .collect();
                st.pending = plan.expected.iter().filter(|&&e| e > 0).count();
                st.next = 0;
                Phase::Armed
            }
        };
    }

    fn on_grad(&self, i: usize, stream: *mut c_void) {
        let mut g = self.lock();
        let Some(st) = g.as_mut() else { return };
        match st.phase {
            Phase::Idle => {}
            Phase::Record => {
                st.fires[i] += 1;
                st.seq.push(i);
            }
            Phase::Armed => {
                st.fires[i] += 1;
                let Some(plan) = &st.plan else { return };
                let expected = plan.expected[i];
                if st.fires[i] > expected {
                    let msg = format!(
                        "the gradient of parameter {i} was accumulated {} times in this backward, {expected} in the recorded one; its bucket's reduction may have started before it was complete",
                        st.fires[i]
                    );
                    st.error.get_or_insert(msg);
                } else if st.fires[i] == expected {
                    let b = plan.buckets.locate[i].0;
                    st.remaining[b] -= 1;
                    st.pending -= 1;
                    st.launch_ready(stream, "hook");
                }
            }
        }
    }

    /// After the step's last backward: every bucket reduced, the averages in the gradients
    /// (only in this rank's ZeRO-1 range when it returns true). `store`: rank 0's recorded order
    /// reaches the others through it (the first step).
    pub fn finish(&self, store: &Store) -> Result<bool> {
        let mut g = self.lock();
        let st = g
            .as_mut()
            .ok_or_else(|| invalid("the overlapped reducer is closed".into()))?;
        let phase = std::mem::replace(&mut st.phase, Phase::Idle);
        st.trace_line(format!(
            r#""event":"backward_end","pending_grads":{}"#,
            st.pending
        ));
        if st.plan.is_none() {
            st.make_plan(store, phase == Phase::Record)?;
        }
        if phase != Phase::Armed {
            st.next = 0;
        }
        let nb = st.plan.as_ref().map_or(0, |p| p.buckets.buckets.len());
        let main_stream = std::ptr::null_mut(); // libtorch's current stream on this thread
        while st.next < nb && st.error.is_none() {
            let b = st.next;
            st.launch(b, main_stream, "end");
            st.next += 1;
        }
        let sharded = st.plan.as_ref().is_some_and(|p| p.pieces.is_some());
        let done = st.complete();
        st.step += 1;
        if let Some(e) = st.error.take() {
            return Err(invalid(format!("overlapped gradient reduction: {e}")));
        }
        done.map(|()| sharded)
    }

    /// ZeRO-1: reduce each gradient element only to the rank that updates it (rank `r` owns
    /// elements `[r * shard, (r + 1) * shard)` of `flat`, the flat gradient buffer every gradient
    /// is a view of): NCCL reduce / store gather to the owner instead of all-reduce, half the
    /// traffic. Applies to plans made from now on, in place (f32) only; [`Reducer::finish`]
    /// says whether a step's gradients were sharded (then only the own range is averaged).
    pub fn shard(&self, flat: &Tensor, shard: i64) {
        if let Some(st) = self.lock().as_mut() {
            st.shard = Some((flat.shallow_clone(), shard));
        }
    }

    /// Drops the buffers, the hooks' work and the communicator handle (the hooks stay but do
    /// nothing; they hold the reducer until the parameters die).
    pub fn close(&self) {
        *self.lock() = None;
    }
}

impl State {
    fn trace_line(&mut self, body: String) {
        let t = self.t0.elapsed().as_micros();
        let (rank, step) = (self.rank, self.step + 1);
        if let Some(f) = &mut self.trace {
            let _ = writeln!(f, r#"{{"rank":{rank},"step":{step},"t_us":{t},{body}}}"#);
        }
    }

    /// Buckets in the recorded order (rank 0's, so every rank plans alike); without a record,
    /// reverse registration order until a recording step has run.
    fn make_plan(&mut self, store: &Store, recorded: bool) -> Result<()> {
        let n = self.params.len();
        let mut last = vec![None; n];
        for (k, &p) in self.seq.iter().enumerate() {
            last[p] = Some(k);
        }
        let mut order: Vec<usize> = (0..n).filter(|&p| last[p].is_some()).collect();
        order.sort_by_key(|&p| last[p]);
        order.extend((0..n).rev().filter(|&p| last[p].is_none()));
        let mine = serde_json::to_vec(&(&order, &self.fires)).map_err(|e| invalid(e.to_string()))?;
        let bytes = store
            .broadcast((self.rank == 0).then_some(mine.as_slice()), self.timeout)
            .map_err(|e| invalid(e.to_string()))?;
        let (order, expected): (Vec<usize>, Vec<u32>) =
            serde_json::from_slice(&bytes).map_err(|e| invalid(format!("rank 0's bucket order: {e}")))?;
        if expected.len() != n {
            return Err(invalid(format!(
                "rank 0 recorded {} parameters, this rank has {n}",
                expected.len()
            )));
        }
        if recorded && expected != self.fires {
            return Err(invalid(
                "this rank's backward accumulated the gradients a different number of times than rank 0's"
                    .into(),
            ));
        }
        let buckets = BucketPlan::in_order(&self.numels, &order, self.bucket_bytes, self.dtype, self.world)
            .map_err(|e| invalid(e.to_string()))?;
        let device = self.params.first().map_or(tch::Device::Cpu, Tensor::device);
        let kind = match self.dtype {
            ReduceDtype::F32 => Kind::Float,
            ReduceDtype::Bf16 => Kind::BFloat16,
            ReduceDtype::F64 => Kind::Double,
        };
        let runs = self.dense_runs(&buckets)?;
        let pieces = match (&runs, &self.shard) {
            (Some((r, _)), Some((flat, shard))) => owner_pieces(r, flat, *shard),
            _ => None,
        };
        let flats = if runs.is_some() {
            Vec::new()
        } else {
            buckets
                .buckets
                .iter()
                .map(|b| Tensor::f_zeros([b.numel as i64], (kind, device)))
                .collect::<std::result::Result<Vec<_>, _>>()?
        };
        let (mut side, mut store_thread) = (None, None);
        match &self.backend {
            Backend::Nccl { .. } => {
                // one event per bucket (compute -> side) and one to join back (side -> compute)
                side = Some(SideStream::new(buckets.buckets.len() + 1).map_err(|e| invalid(e.to_string()))?)
            }
            Backend::Store(s) => store_thread = Some(spawn_store_thread(s.clone(), self.timeout)?),
        }
        let first: Vec<usize> = buckets.buckets.iter().map(|b| b.slots.len()).collect();
        let how = match &runs {
            Some((r, _)) => format!(
                "in place in the gradients ({} stretches of memory{})",
                r.iter().map(Vec::len).sum::<usize>(),
                match &pieces {
                    Some(p) => format!(
                        ", ZeRO-1: {} pieces each reduced to its owner only",
                        p.iter().map(Vec::len).sum::<usize>()
                    ),
                    None => String::new(),
                }
            ),
            None => "through one flat copy per bucket".to_string(),
        };
        tracing::info!(
            "overlapped gradient reduction: {} buckets in the backward's order (parameters per bucket {first:?}), {how}{}",
            buckets.buckets.len(),
            if recorded { "" } else { "; no backward recorded yet" }
        );
        self.plan = Some(Plan {
            buckets,
            expected: if recorded { expected } else { vec![0; n] },
            runs,
            pieces,
            flats,
            side,
            store: store_thread,
        });
        Ok(())
    }

    /// f32 reduction of gradients that are contiguous f32 tensors: per bucket, its parameters
    /// sorted by gradient address and merged into stretches of adjacent memory (AdamW's flat
    /// gradient buffer makes them long), each reduced in place; `None` when that does not apply
    /// (bf16 reduction, an undefined, non-f32, non-contiguous or overlapping gradient).
    #[allow(clippy::type_complexity)]
    fn dense_runs(&self, buckets: &BucketPlan) -> Result<Option<(Vec<Vec<Run>>, Vec<u64>)>> {
        if self.dtype != ReduceDtype::F32 {
            return Ok(None);
        }
        let mut ptrs = Vec::with_capacity(self.params.len());
        for p in &self.params {
            let g = p.f_grad()?;
            if !g.defined() || g.kind() != Kind::Float || !g.is_contiguous() {
                return Ok(None);
            }
            ptrs.push(g.data_ptr() as u64);
        }
        let mut all = Vec::with_capacity(buckets.buckets.len());
        for b in &buckets.buckets {
            let mut ps: Vec<usize> = b.slots.iter().map(|s| s.param).collect();
            ps.sort_by_key(|&p| ptrs[p]);
            let mut runs: Vec<Run> = Vec::new();
            for p in ps {
                let end = runs.last().map(|r| r.ptr + 4 * r.len as u64);
                match runs.last_mut() {
                    Some(r) if end == Some(ptrs[p]) => {
                        r.len += self.numels[p];
                        r.params.push(p);
                    }
                    Some(_) if end > Some(ptrs[p]) => return Ok(None),
                    _ => runs.push(Run {
                        ptr: ptrs[p],
                        len: self.numels[p],
                        params: vec![p],
                    }),
                }
            }
            all.push(runs);
        }
        Ok(Some((all, ptrs)))
    }

    /// Launches every bucket whose gradients are all ready, in order.
    fn launch_ready(&mut self, stream: *mut c_void, from: &str) {
        let nb = self.remaining.len();
        while self.next < nb && self.remaining[self.next] == 0 && self.error.is_none() {
            let b = self.next;
            self.launch(b, stream, from);
            self.next += 1;
        }
    }

    /// Copies bucket `b`'s gradients into its flat buffer (on `stream`, the current one) and
    /// starts its reduction.
    fn launch(&mut self, b: usize, stream: *mut c_void, from: &str) {
        let pending = self.pending;
        let nparams = self.params.len();
        self.trace_line(format!(
            r#""event":"launch","bucket":{b},"from":"{from}","pending_grads":{pending},"params":{nparams}"#
        ));
        if let Err(e) = self.try_launch(b, stream) {
            self.error.get_or_insert(e.to_string());
        }
    }

    fn try_launch(&mut self, b: usize, stream: *mut c_void) -> Result<()> {
        let _guard = tch::no_grad_guard();
        let plan = self
            .plan
            .as_mut()
            .ok_or_else(|| invalid("no bucket plan".into()))?;
        let bucket = &plan.buckets.buckets[b];
        // What goes on the wire, `(address, elements, owner)`: in place, the bucket's stretches
        // of gradient memory (ZeRO-1: cut at the ranks' ranges, each to its owner); else the
        // bucket's flat copy (written here, on the current stream).
        let mut spans: Vec<(u64, usize, Option<usize>)> = Vec::new();
        match (&plan.runs, &plan.pieces, &self.shard) {
            (Some((runs, ptrs)), pieces, shard) => {
                for s in &bucket.slots {
                    let at = self.params[s.param].f_grad()?.data_ptr() as u64;
                    if at != ptrs[s.param] {
                        return Err(invalid(format!(
                            "the gradient of parameter {} moved since the buckets were planned",
                            s.param
                        )));
                    }
                }
                match (pieces, shard) {
                    (Some(pieces), Some((flat, _))) => {
                        let base = flat.data_ptr() as u64;
                        spans.extend(
                            pieces[b]
                                .iter()
                                .map(|&(o, n, r)| (base + 4 * o as u64, n, Some(r))),
                        );
                    }
                    _ => spans.extend(runs[b].iter().map(|r| (r.ptr, r.len, None))),
                }
            }
            (None, _, _) => {
                let flat = &plan.flats[b];
                for s in &bucket.slots {
                    let g = self.params[s.param].f_grad()?;
                    let mut dst = flat.f_narrow(0, s.offset as i64, s.numel as i64)?;
                    if g.defined() {
                        dst.f_copy_(&g.f_view([-1])?)?;
                    } else {
                        let _ = dst.f_zero_()?;
                    }
                }
                spans.push((flat.data_ptr() as u64, bucket.numel, None));
            }
        }
        match &self.backend {
            Backend::Nccl { comm, ctx } => {
                ctx.bind_to_thread().map_err(|e| invalid(format!("{e:?}")))?;
                let side = plan
                    .side
                    .as_ref()
                    .ok_or_else(|| invalid("no side stream".into()))?;
                side.wait_for(stream, b).map_err(|e| invalid(e.to_string()))?;
                let dtype = plan.buckets.dtype;
                for (ptr, len, owner) in spans {
                    // SAFETY: `len` contiguous elements of the reduction dtype on this device
                    // from `ptr`: a stretch of the (checked, unmoved) gradients or the bucket's
                    // flat copy, both alive for the run (the compute stream joins the side stream
                    // in `complete` before anything writes them again); the
                    // backward no longer writes them (their accumulations are complete).
                    unsafe {
                        match owner {
                            None => comm.all_reduce(ptr, ptr, len, dtype, ReduceOp::Avg, side.raw()),
                            Some(r) => comm.reduce(ptr, ptr, len, dtype, ReduceOp::Avg, r, side.raw()),
                        }
                    }
                    .map_err(|e| invalid(e.to_string()))?;
                }
            }
            Backend::Store(_) => {
                let bytes_of = |t: &Tensor| -> Result<Vec<u8>> {
                    let v: Vec<f32> = Vec::try_from(&t.f_to_kind(Kind::Float)?.f_view([-1])?)?;
                    Ok(v.iter().flat_map(|x| x.to_le_bytes()).collect())
                };
                let parts = match (&plan.runs, &plan.pieces, &self.shard) {
                    (Some(_), Some(pieces), Some((flat, _))) => pieces[b]
                        .iter()
                        .map(|&(o, n, r)| Ok((Some(r), bytes_of(&flat.f_narrow(0, o, n as i64)?)?)))
                        .collect::<Result<Vec<_>>>()?,
                    (Some((runs, _)), _, _) => {
                        let mut bytes = Vec::new();
                        for p in runs[b].iter().flat_map(|r| &r.params) {
                            bytes.extend(bytes_of(&self.params[*p].f_grad()?)?);
                        }
                        vec![(None, bytes)]
                    }
                    (None, _, _) => vec![(None, bytes_of(&plan.flats[b])?)],
                };
                let th = plan
                    .store
                    .as_ref()
                    .ok_or_else(|| invalid("no reducer thread".into()))?;
                th.jobs
                    .send((b, parts))
                    .map_err(|_| invalid("the reducer thread stopped".into()))?;
            }
        }
        self.in_flight += 1;
        Ok(())
    }

    /// Waits for every launched bucket and copies the averages into the gradients.
    fn complete(&mut self) -> Result<()> {
        let launched = std::mem::take(&mut self.in_flight);
        let _guard = tch::no_grad_guard();
        let plan = self
            .plan
            .as_mut()
            .ok_or_else(|| invalid("no bucket plan".into()))?;
        match &self.backend {
            Backend::Nccl { comm, .. } => {
                if let Some(side) = &plan.side {
                    // The compute stream waits for the reductions on the GPU (the last event
                    // slot), not the host: the optimiser and the copies back queue behind them.
                    // Errors and timeouts surface at the step's metric mean (`Ddp::mean` waits
                    // for the compute stream, which now includes the side stream's work).
                    let join = plan.buckets.buckets.len();
                    side.join_into(std::ptr::null_mut(), join)
                        .map_err(|e| invalid(e.to_string()))?;
                    comm.check_async().map_err(|e| invalid(e.to_string()))?;
                }
            }
            Backend::Store(_) => {
                let th = plan
                    .store
                    .as_ref()
                    .ok_or_else(|| invalid("no reducer thread".into()))?;
                for _ in 0..launched {
                    let (b, parts) = th
                        .results
                        .recv()
                        .map_err(|_| invalid("the reducer thread stopped".into()))?;
                    let parts = parts.map_err(invalid)?;
                    match (&plan.runs, &plan.pieces, &self.shard) {
                        (Some(_), Some(pieces), Some((flat, _))) => {
                            // only the owned pieces came back
                            for (&(o, n, _), mean) in pieces[b].iter().zip(&parts) {
                                if let Some(mean) = mean {
                                    flat.f_narrow(0, o, n as i64)?
                                        .f_copy_(&Tensor::from_slice(mean))?;
                                }
                            }
                        }
                        (Some((runs, _)), _, _) => {
                            // back into the gradients, in the order they were read
                            let mean = parts
                                .first()
                                .and_then(Option::as_ref)
                                .map_or(&[][..], Vec::as_slice);
                            let mut off = 0;
                            for &p in runs[b].iter().flat_map(|r| &r.params) {
                                let n = self.numels[p];
                                let reduced = Tensor::from_slice(&mean[off..off + n]);
                                self.params[p].f_grad()?.f_view([-1])?.f_copy_(&reduced)?;
                                off += n;
                            }
                        }
                        (None, _, _) => {
                            let mean = parts
                                .first()
                                .and_then(Option::as_ref)
                                .map_or(&[][..], Vec::as_slice);
                            let flat = &mut plan.flats[b];
                            let reduced = Tensor::from_slice(mean).f_to_kind(flat.kind())?;
                            flat.f_copy_(&reduced)?;
                        }
                    }
                }
            }
        }
        if self.error.is_some() || launched != plan.buckets.buckets.len() {
            return Ok(()); // the error is reported by `finish`
        }
        // In place the averages are already in the gradients; else copy them back.
        for (bucket, flat) in plan.buckets.buckets.iter().zip(&plan.flats) {
            for s in &bucket.slots {
                let g = self.params[s.param].f_grad()?;
                if g.defined() {
                    g.f_view([-1])?
                        .f_copy_(&flat.f_narrow(0, s.offset as i64, s.numel as i64)?)?;
                }
            }
        }
        if plan.expected.iter().all(|&e| e == 0) {
            // provisional plan (nothing recorded): plan again from the next recorded backward
            self.plan = None;
        }
        Ok(())
    }
}

/// ZeRO-1: `runs` (per bucket) cut at the ranks' ranges of `flat` (`shard` elements each), as
/// `(element offset in flat, length, owner)`; `None` when a stretch lies outside `flat`.
fn owner_pieces(runs: &[Vec<Run>], flat: &Tensor, shard: i64) -> Option<Vec<Vec<(i64, usize, usize)>>> {
    let base = flat.data_ptr() as u64;
    let n = flat.numel() as i64;
    if shard <= 0 {
        return None;
    }
    let mut all = Vec::with_capacity(runs.len());
    for bucket in runs {
        let mut pieces = Vec::new();
        for r in bucket {
            let start = (r.ptr.checked_sub(base)? / 4) as i64;
            let end = start + r.len as i64;
            if end > n {
                return None;
            }
            let mut o = start;
            while o < end {
                let owner = o / shard;
                let stop = end.min((owner + 1) * shard);
                pieces.push((o, (stop - o) as usize, owner as usize));
                o = stop;
            }
        }
        all.push(pieces);
    }
    Some(all)
}

fn spawn_store_thread(store: Arc<Store>, timeout: Duration) -> Result<StoreThread> {
    let (jobs, jobs_rx) = mpsc::channel::<StoreJob>();
    let (results_tx, results) = mpsc::channel();
    std::thread::Builder::new()
        .name("flamia-grad-reducer".into())
        .spawn(move || {
            for (b, parts) in jobs_rx {
                let r = parts
                    .iter()
                    .map(|(root, bytes)| match root {
                        None => store
                            .all_gather(bytes, timeout)
                            .map(|all| Some(mean_of_ranks(&all))),
                        Some(root) => store
                            .gather_to(*root, bytes, timeout)
                            .map(|all| all.map(|a| mean_of_ranks(&a))),
                    })
                    .collect::<std::result::Result<Vec<_>, _>>()
                    .map_err(|e| e.to_string());
                if results_tx.send((b, r)).is_err() {
                    break;
                }
            }
        })
        .map_err(|e| invalid(format!("reducer thread: {e}")))?;
    Ok(StoreThread { jobs, results })
}
