//! NCCL communicator over raw device pointers and a raw CUDA stream (so the trainer can pass
//! libtorch tensors' `data_ptr()` and the current stream), through cudarc's `nccl::sys`
//! (loaded at run time: this builds and its CPU tests run without CUDA).
//!
//! Failure handling: collectives are enqueued asynchronously; [`Communicator::wait`] polls the
//! stream and `ncclCommGetAsyncError` against a timeout and the group's [`Health`], and aborts the
//! communicator (`ncclCommAbort`, which releases kernels spinning on a dead peer) instead of
//! hanging. A failure recorded by the heartbeat thread also aborts every registered communicator.
//! Communicator creation blocks inside NCCL; a watchdog records a failure if it does not finish
//! within the timeout (and the health's exit grace then ends the process).
//!
//! The process must have the right CUDA device current (`cudaSetDevice(local_rank)`, which tch
//! does when it first touches `cuda:<local_rank>`) before [`Communicator::new`].

use std::ffi::{c_void, CStr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use cudarc::driver::sys as cu;
use cudarc::nccl::sys;

use crate::bucket::ReduceDtype;
use crate::error::{DistError, Result};
use crate::health::Health;

/// The opaque 128-byte id rank 0 creates and the rendezvous publishes.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct NcclId(pub [u8; 128]);

impl std::fmt::Debug for NcclId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "NcclId({:02x?}..)", &self.0[..8])
    }
}

/// True when a NCCL library can be loaded (cudarc looks for `libnccl.so`; pip wheels ship only
/// `libnccl.so.2`, so the launchers put a `libnccl.so` link on `LD_LIBRARY_PATH`).
pub fn nccl_available() -> bool {
    // SAFETY: only tries to dlopen the library.
    unsafe { sys::is_culib_present() }
}

fn need_nccl() -> Result<()> {
    if nccl_available() {
        Ok(())
    } else {
        Err(DistError::Nccl {
            op: "load",
            reason: "libnccl.so not found on LD_LIBRARY_PATH (pip's nvidia-nccl ships libnccl.so.2: \
                     link it as libnccl.so in a directory on LD_LIBRARY_PATH, as launch/local.sh does)"
                .into(),
        })
    }
}

fn check(op: &'static str, r: sys::ncclResult_t) -> Result<()> {
    if r == sys::ncclResult_t::ncclSuccess {
        return Ok(());
    }
    // SAFETY: ncclGetErrorString returns a static C string.
    let msg = unsafe { CStr::from_ptr(sys::ncclGetErrorString(r)) }
        .to_string_lossy()
        .into_owned();
    Err(DistError::Nccl {
        op,
        reason: format!("{r:?}: {msg}"),
    })
}

impl NcclId {
    /// A fresh id (rank 0 only).
    pub fn new() -> Result<Self> {
        need_nccl()?;
        let mut id = sys::ncclUniqueId { internal: [0; 128] };
        // SAFETY: writes 128 bytes into `id`.
        check("ncclGetUniqueId", unsafe { sys::ncclGetUniqueId(&mut id) })?;
        Ok(NcclId(id.internal.map(|c| c as u8)))
    }

    /// From the rendezvous payload.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self> {
        let arr: [u8; 128] = bytes.try_into().map_err(|_| DistError::Nccl {
            op: "unique id",
            reason: format!("expected 128 bytes from rank 0, got {}", bytes.len()),
        })?;
        Ok(NcclId(arr))
    }
}

/// Reduction operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReduceOp {
    Sum,
    /// Sum divided by the world size (done inside NCCL).
    Avg,
    Max,
}

impl ReduceOp {
    fn raw(self) -> sys::ncclRedOp_t {
        match self {
            ReduceOp::Sum => sys::ncclRedOp_t::ncclSum,
            ReduceOp::Avg => sys::ncclRedOp_t::ncclAvg,
            ReduceOp::Max => sys::ncclRedOp_t::ncclMax,
        }
    }
}

fn raw_dtype(d: ReduceDtype) -> sys::ncclDataType_t {
    match d {
        ReduceDtype::F32 => sys::ncclDataType_t::ncclFloat32,
        ReduceDtype::Bf16 => sys::ncclDataType_t::ncclBfloat16,
        ReduceDtype::F64 => sys::ncclDataType_t::ncclFloat64,
    }
}

/// Timing of failure detection.
#[derive(Debug, Clone, Copy)]
pub struct CommOptions {
    /// A collective (or communicator creation) not done after this is treated as a hang.
    pub timeout: Duration,
    /// How often `wait` polls the stream and NCCL's asynchronous error.
    pub poll: Duration,
}

impl Default for CommOptions {
    fn default() -> Self {
        CommOptions {
            timeout: Duration::from_secs(300),
            poll: Duration::from_micros(200),
        }
    }
}

struct RawComm(sys::ncclComm_t);
// SAFETY: NCCL communicators may be used from any thread (one at a time for enqueueing, which
// the RwLock's write side guarantees for abort/destroy; NCCL allows ncclCommAbort concurrently
// with a blocked operation, but we still serialise with enqueues, which do not block on peers).
unsafe impl Send for RawComm {}
unsafe impl Sync for RawComm {}

/// One rank's NCCL communicator.
pub struct Communicator {
    comm: RwLock<RawComm>,
    aborted: AtomicBool,
    rank: usize,
    world_size: usize,
    opts: CommOptions,
    health: Option<Arc<Health>>,
}

impl std::fmt::Debug for Communicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Communicator")
            .field("rank", &self.rank)
            .field("world_size", &self.world_size)
            .finish()
    }
}

impl Communicator {
    /// Join the NCCL clique `id` as `rank` of `world_size` on the current CUDA device. With
    /// `health`, a group failure aborts this communicator and collectives report it.
    pub fn new(
        id: &NcclId,
        rank: usize,
        world_size: usize,
        opts: CommOptions,
        health: Option<Arc<Health>>,
    ) -> Result<Arc<Self>> {
        need_nccl()?;
        let done = Arc::new(AtomicBool::new(false));
        if let Some(h) = &health {
            let (done, h, timeout) = (done.clone(), h.clone(), opts.timeout);
            let _ = std::thread::Builder::new().name("flamia-nccl-init-watchdog".into()).spawn(move || {
                let start = Instant::now();
                while !done.load(Ordering::SeqCst) {
                    if start.elapsed() > timeout {
                        h.record(format!(
                            "rank {rank}: ncclCommInitRank did not finish within {timeout:?} (a peer never joined?)"
                        ));
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(50));
                }
            });
        }
        let raw_id = sys::ncclUniqueId {
            internal: id.0.map(|b| b as _),
        };
        let mut comm: sys::ncclComm_t = std::ptr::null_mut();
        // SAFETY: `comm` receives a new communicator; arguments were range-checked by the group.
        let r = unsafe { sys::ncclCommInitRank(&mut comm, world_size as i32, raw_id, rank as i32) };
        done.store(true, Ordering::SeqCst);
        check("ncclCommInitRank", r)?;
        let c = Arc::new(Communicator {
            comm: RwLock::new(RawComm(comm)),
            aborted: AtomicBool::new(false),
            rank,
            world_size,
            opts,
            health: health.clone(),
        });
        if let Some(h) = health {
            let weak = Arc::downgrade(&c);
            h.on_failure(move || {
                if let Some(c) = weak.upgrade() {
                    c.abort();
                }
            });
        }
        Ok(c)
    }

    pub fn rank(&self) -> usize {
        self.rank
    }
    pub fn world_size(&self) -> usize {
        self.world_size
    }

    /// Abort: in-flight and future collectives fail instead of waiting on peers.
    pub fn abort(&self) {
        if self.aborted.swap(true, Ordering::SeqCst) {
            return;
        }
        let c = self.comm.write().unwrap_or_else(|p| p.into_inner());
        // SAFETY: the communicator is live (not yet aborted/destroyed); the write lock keeps
        // enqueues out.
        unsafe {
            sys::ncclCommAbort(c.0);
        }
    }

    fn enqueue(&self, op: &'static str, f: impl FnOnce(sys::ncclComm_t) -> sys::ncclResult_t) -> Result<()> {
        if let Some(h) = &self.health {
            h.check()?;
        }
        let c = self.comm.read().unwrap_or_else(|p| p.into_inner());
        if self.aborted.load(Ordering::SeqCst) {
            return Err(DistError::Nccl {
                op,
                reason: "communicator was aborted after an earlier failure".into(),
            });
        }
        check(op, f(c.0))
    }

    /// All-reduce `count` elements from `send` into `recv` (may be equal: in place) on `stream`.
    ///
    /// # Safety
    /// `send`/`recv` must be device pointers to at least `count` elements of `dtype` on this
    /// communicator's device, valid until the operation completes on `stream` (a `CUstream` /
    /// `cudaStream_t`; null is the legacy default stream).
    pub unsafe fn all_reduce(
        &self,
        send: u64,
        recv: u64,
        count: usize,
        dtype: ReduceDtype,
        op: ReduceOp,
        stream: *mut c_void,
    ) -> Result<()> {
        self.enqueue("ncclAllReduce", |c| {
            // SAFETY: forwarded from the caller's contract.
            unsafe {
                sys::ncclAllReduce(
                    send as *const c_void,
                    recv as *mut c_void,
                    count,
                    raw_dtype(dtype),
                    op.raw(),
                    c,
                    stream as _,
                )
            }
        })
    }

    /// Reduce to one rank: `root`'s `recv` receives the reduction of every rank's `send`
    /// (`count` elements; in place when equal); the others' `recv` is not written.
    ///
    /// # Safety
    /// As [`Communicator::all_reduce`].
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn reduce(
        &self,
        send: u64,
        recv: u64,
        count: usize,
        dtype: ReduceDtype,
        op: ReduceOp,
        root: usize,
        stream: *mut c_void,
    ) -> Result<()> {
        self.enqueue("ncclReduce", |c| {
            // SAFETY: forwarded from the caller's contract.
            unsafe {
                sys::ncclReduce(
                    send as *const c_void,
                    recv as *mut c_void,
                    count,
                    raw_dtype(dtype),
                    op.raw(),
                    root as i32,
                    c,
                    stream as _,
                )
            }
        })
    }

    /// Reduce-scatter: `send` holds `recv_count * world_size` elements; rank `r` receives the
    /// reduction of block `r` into `recv` (`recv_count` elements).
    ///
    /// # Safety
    /// As [`Communicator::all_reduce`], with the sizes above.
    pub unsafe fn reduce_scatter(
        &self,
        send: u64,
        recv: u64,
        recv_count: usize,
        dtype: ReduceDtype,
        op: ReduceOp,
        stream: *mut c_void,
    ) -> Result<()> {
        self.enqueue("ncclReduceScatter", |c| {
            // SAFETY: forwarded from the caller's contract.
            unsafe {
                sys::ncclReduceScatter(
                    send as *const c_void,
                    recv as *mut c_void,
                    recv_count,
                    raw_dtype(dtype),
                    op.raw(),
                    c,
                    stream as _,
                )
            }
        })
    }

    /// All-gather: every rank contributes `send_count` elements; `recv` receives
    /// `send_count * world_size`, rank `r`'s block at `r * send_count`.
    ///
    /// # Safety
    /// As [`Communicator::all_reduce`], with the sizes above.
    pub unsafe fn all_gather(
        &self,
        send: u64,
        recv: u64,
        send_count: usize,
        dtype: ReduceDtype,
        stream: *mut c_void,
    ) -> Result<()> {
        self.enqueue("ncclAllGather", |c| {
            // SAFETY: forwarded from the caller's contract.
            unsafe {
                sys::ncclAllGather(
                    send as *const c_void,
                    recv as *mut c_void,
                    send_count,
                    raw_dtype(dtype),
                    c,
                    stream as _,
                )
            }
        })
    }

    /// Broadcast `count` elements from `root`'s `send` into every rank's `recv` (may be equal).
    ///
    /// # Safety
    /// As [`Communicator::all_reduce`].
    pub unsafe fn broadcast(
        &self,
        send: u64,
        recv: u64,
        count: usize,
        dtype: ReduceDtype,
        root: usize,
        stream: *mut c_void,
    ) -> Result<()> {
        self.enqueue("ncclBroadcast", |c| {
            // SAFETY: forwarded from the caller's contract.
            unsafe {
                sys::ncclBroadcast(
                    send as *const c_void,
                    recv as *mut c_void,
                    count,
                    raw_dtype(dtype),
                    root as i32,
                    c,
                    stream as _,
                )
            }
        })
    }

    /// NCCL's asynchronous error state (`ncclCommGetAsyncError`); aborts on error.
    pub fn check_async(&self) -> Result<()> {
        if let Some(h) = &self.health {
            if let Err(e) = h.check() {
                self.abort();
                return Err(e);
            }
        }
        let c = self.comm.read().unwrap_or_else(|p| p.into_inner());
        if self.aborted.load(Ordering::SeqCst) {
            return Err(DistError::Nccl {
                op: "async",
                reason: "communicator was aborted".into(),
            });
        }
        let mut state = sys::ncclResult_t::ncclSuccess;
        // SAFETY: live communicator (checked under the lock), `state` is a valid out pointer.
        check("ncclCommGetAsyncError", unsafe {
            sys::ncclCommGetAsyncError(c.0, &mut state)
        })?;
        drop(c);
        if state != sys::ncclResult_t::ncclSuccess && state != sys::ncclResult_t::ncclInProgress {
            self.abort();
            return check("asynchronous", state);
        }
        Ok(())
    }

    /// Wait until all work enqueued on `stream` is done, polling NCCL's asynchronous errors and
    /// the group health; on an error, a peer failure, or after the timeout, abort and return an
    /// error (never hang).
    pub fn wait(&self, stream: *mut c_void, op: &'static str) -> Result<()> {
        let start = Instant::now();
        loop {
            // SAFETY: querying a stream handle the caller owns; null is the legacy stream.
            let q = unsafe { cu::cuStreamQuery(stream as cu::CUstream) };
            match q {
                cu::CUresult::CUDA_SUCCESS => return self.check_async(),
                cu::CUresult::CUDA_ERROR_NOT_READY => {}
                other => {
                    self.abort();
                    return Err(DistError::Nccl {
                        op,
                        reason: format!("CUDA stream error {other:?}"),
                    });
                }
            }
            self.check_async()?;
            if start.elapsed() > self.opts.timeout {
                self.abort();
                if let Some(h) = &self.health {
                    h.record(format!(
                        "rank {}: NCCL {op} timed out after {:?}",
                        self.rank, self.opts.timeout
                    ));
                }
                return Err(DistError::CollectiveTimeout {
                    op,
                    timeout: self.opts.timeout,
                });
            }
            // the first half millisecond spinning (a step's collectives usually end within it;
            // a sleep overshoots by tens to hundreds of microseconds), then `poll` sleeps
            if start.elapsed() < SPIN {
                std::thread::yield_now();
            } else {
                std::thread::sleep(self.opts.poll);
            }
        }
    }
}

/// How long [`Communicator::wait`] polls without sleeping.
const SPIN: Duration = Duration::from_micros(500);

impl Drop for Communicator {
    fn drop(&mut self) {
        if !self.aborted.load(Ordering::SeqCst) {
            let c = self.comm.write().unwrap_or_else(|p| p.into_inner());
            // SAFETY: live communicator, no other user (we are in Drop).
            unsafe {
                sys::ncclCommDestroy(c.0);
            }
        }
    }
}
