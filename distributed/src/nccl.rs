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
//! Abort protocol (see [`AbortGate`]): every call on the handle runs under the read side of a
//! lock after checking the `aborted` flag; [`Communicator::abort`] sets the flag first (no call
//! starts after it), then takes the write side if it can within [`ABORT_LOCK_WAIT`] and aborts
//! with no call in progress. If a call still holds the read side after that wait, the call is
//! blocked inside NCCL (an enqueue normally returns in microseconds; a lazy connection to a dead
//! peer never does). NCCL documents `ncclCommAbort` beside another call only for non-blocking
//! communicators, and ours are blocking, so `abort` then leaves the handle alone: it returns at
//! once, no later call touches the handle (they see the flag), `Drop` does not destroy it, and
//! the group's exit timer, which [`Health`] starts before it runs the abort hooks, ends the
//! process (a process exit releases the device's kernels either way).
//!
//! The process must have the right CUDA device current (`cudaSetDevice(local_rank)`, which tch
//! does when it first touches `cuda:<local_rank>`) before [`Communicator::new`].

use std::ffi::{c_void, CStr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock, TryLockError};
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

#[derive(Clone, Copy)]
struct RawComm(sys::ncclComm_t);
// SAFETY: NCCL communicators may be used from any thread; [`AbortGate`] orders the uses with the
// abort (module documentation).
unsafe impl Send for RawComm {}
unsafe impl Sync for RawComm {}

/// How long [`Communicator::abort`] waits for calls in progress to leave; a call still in progress
/// after it is taken for blocked inside NCCL, and the handle is left alone.
pub const ABORT_LOCK_WAIT: Duration = Duration::from_millis(500);

/// How an abort reached the handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AbortPath {
    /// No call was in progress: aborted with exclusive access.
    Exclusive,
    /// A call held the handle for the whole wait (blocked inside the library): not aborted (the
    /// library's abort is not called beside it); no later call uses the handle.
    Blocked,
}

/// A raw handle used by calls that may block forever, and aborted once by another thread: the
/// protocol of the module documentation, independent of NCCL so that it is tested without it.
pub struct AbortGate<H: Copy> {
    calls: RwLock<()>,
    handle: H,
    aborted: AtomicBool,
    wait: Duration,
}

impl<H: Copy> AbortGate<H> {
    /// A live handle; `abort` waits up to `wait` for calls in progress.
    pub fn new(handle: H, wait: Duration) -> Self {
        AbortGate {
            calls: RwLock::new(()),
            handle,
            aborted: AtomicBool::new(false),
            wait,
        }
    }

    /// Runs `f` with the handle, unless the gate was aborted (then `None`, and `f` does not run).
    /// The read side is held while `f` runs.
    pub fn call<R>(&self, f: impl FnOnce(H) -> R) -> Option<R> {
        let _in_call = self.calls.read().unwrap_or_else(|p| p.into_inner());
        if self.aborted.load(Ordering::SeqCst) {
            return None;
        }
        Some(f(self.handle))
    }

    /// Aborts once: `f` receives the handle (and must free it) when no call is in progress within
    /// the wait; `None` when already aborted. Never blocks for longer than the wait, whatever the
    /// calls in progress do.
    pub fn abort(&self, f: impl FnOnce(H)) -> Option<AbortPath> {
        if self.aborted.swap(true, Ordering::SeqCst) {
            return None;
        }
        // From here on no call starts: `call` checks the flag under the read side.
        let deadline = Instant::now() + self.wait;
        loop {
            match self.calls.try_write() {
                Ok(_exclusive) => {
                    f(self.handle);
                    return Some(AbortPath::Exclusive);
                }
                Err(TryLockError::Poisoned(p)) => {
                    let _exclusive = p.into_inner();
                    f(self.handle);
                    return Some(AbortPath::Exclusive);
                }
                Err(TryLockError::WouldBlock) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(1));
                }
                Err(TryLockError::WouldBlock) => break,
            }
        }
        // A call has held the read side for the whole wait: it is blocked inside the library,
        // which does not allow its abort beside it. Later calls see the flag; the handle stays.
        Some(AbortPath::Blocked)
    }

    /// True once `abort` has been called.
    pub fn is_aborted(&self) -> bool {
        self.aborted.load(Ordering::SeqCst)
    }

    /// The handle when never aborted (exclusive access: for `Drop`).
    fn live_handle(&mut self) -> Option<H> {
        (!*self.aborted.get_mut()).then_some(self.handle)
    }
}

/// One rank's NCCL communicator.
pub struct Communicator {
    gate: AbortGate<RawComm>,
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
            gate: AbortGate::new(RawComm(comm), ABORT_LOCK_WAIT),
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

    /// Abort: in-flight and future collectives fail instead of waiting on peers. Returns within
    /// [`ABORT_LOCK_WAIT`] even while another thread is blocked inside an NCCL call, which it
    /// then leaves alone (module documentation).
    pub fn abort(&self) {
        let path = self.gate.abort(|c| {
            // SAFETY: the gate runs this at most once, on the live communicator, with no call in
            // progress; no call uses the handle afterwards.
            unsafe {
                sys::ncclCommAbort(c.0);
            }
        });
        if path == Some(AbortPath::Blocked) {
            eprintln!(
                "flamia-dist: rank {}: an NCCL call has been blocked for more than {ABORT_LOCK_WAIT:?}; \
                 the communicator is not aborted beside it (a blocking communicator does not allow \
                 that) and is not used again: the group's exit timer ends this process",
                self.rank
            );
        }
    }

    /// True once the communicator has been aborted.
    pub fn is_aborted(&self) -> bool {
        self.gate.is_aborted()
    }

    fn enqueue(&self, op: &'static str, f: impl FnOnce(sys::ncclComm_t) -> sys::ncclResult_t) -> Result<()> {
        if let Some(h) = &self.health {
            h.check()?;
        }
        match self.gate.call(|c| f(c.0)) {
            Some(r) => check(op, r),
            None => Err(DistError::Nccl {
                op,
                reason: "communicator was aborted after an earlier failure".into(),
            }),
        }
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
        let mut state = sys::ncclResult_t::ncclSuccess;
        // SAFETY: the gate passes the live communicator; `state` is a valid out pointer.
        let r = self
            .gate
            .call(|c| unsafe { sys::ncclCommGetAsyncError(c.0, &mut state) })
            .ok_or_else(|| DistError::Nccl {
                op: "async",
                reason: "communicator was aborted".into(),
            })?;
        check("ncclCommGetAsyncError", r)?;
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
        if let Some(c) = self.gate.live_handle() {
            // SAFETY: live communicator (never aborted), no other user (we are in Drop).
            unsafe {
                sys::ncclCommDestroy(c.0);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::sync::mpsc;

    /// The case of the review: a call blocked inside the library holds the handle; the abort
    /// must neither wait for it forever, nor call the library's abort beside it, nor let anything
    /// use the handle afterwards.
    #[test]
    fn abort_returns_while_a_call_is_blocked_and_leaves_the_handle_alone() {
        let gate = Arc::new(AbortGate::new(7u32, Duration::from_millis(50)));
        let (entered_tx, entered_rx) = mpsc::channel::<()>();
        let (release_tx, release_rx) = mpsc::channel::<()>();
        let g = gate.clone();
        let blocked = std::thread::spawn(move || {
            g.call(|h| {
                entered_tx.send(()).unwrap();
                // "Inside NCCL" until released below (or after 20 s).
                let released = release_rx.recv_timeout(Duration::from_secs(20)).is_ok();
                (h, released)
            })
        });
        entered_rx.recv_timeout(Duration::from_secs(10)).unwrap();
        let (done_tx, done_rx) = mpsc::channel();
        let g = gate.clone();
        let started = Instant::now();
        std::thread::spawn(move || {
            let path = g.abort(|_| panic!("the library's abort beside a blocked call"));
            let _ = done_tx.send(path);
        });
        let path = done_rx
            .recv_timeout(Duration::from_secs(5))
            .expect("abort returns while a call is blocked");
        assert_eq!(path, Some(AbortPath::Blocked));
        assert!(started.elapsed() >= Duration::from_millis(50), "waited first");
        let ran = AtomicUsize::new(0);
        assert_eq!(gate.call(|_| ran.fetch_add(1, Ordering::SeqCst)), None);
        assert_eq!(ran.load(Ordering::SeqCst), 0, "no call after the abort");
        release_tx.send(()).unwrap();
        assert_eq!(
            blocked.join().unwrap(),
            Some((7, true)),
            "the blocked call itself completes"
        );
        assert_eq!(gate.abort(|_| panic!("aborted twice")), None);
    }

    /// A call in progress that returns normally (an ordinary enqueue) finishes before the abort
    /// frees the handle: the abort takes the exclusive side.
    #[test]
    fn abort_waits_for_a_short_call_and_is_exclusive() {
        let gate = Arc::new(AbortGate::new((), Duration::from_secs(5)));
        let finished = Arc::new(AtomicBool::new(false));
        let (entered_tx, entered_rx) = mpsc::channel::<()>();
        let (g, f) = (gate.clone(), finished.clone());
        let call = std::thread::spawn(move || {
            g.call(|_| {
                entered_tx.send(()).unwrap();
                std::thread::sleep(Duration::from_millis(100));
                f.store(true, Ordering::SeqCst);
            })
        });
        entered_rx.recv_timeout(Duration::from_secs(10)).unwrap();
        let path = gate.abort(|_| {
            assert!(
                finished.load(Ordering::SeqCst),
                "the handle is freed only after the call in progress returned"
            );
        });
        assert_eq!(path, Some(AbortPath::Exclusive));
        assert_eq!(call.join().unwrap(), Some(()));
        assert!(gate.is_aborted());
        assert_eq!(gate.call(|_| ()), None);
    }
}
