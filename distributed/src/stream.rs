//! A CUDA side stream for collectives that overlap the compute stream, with one reusable event
//! per slot to order a collective after the compute stream's work so far.
//!
//! The stream is created non-blocking (`CU_STREAM_NON_BLOCKING`): libtorch computes on the
//! legacy default stream, which would otherwise synchronise implicitly with every blocking
//! stream and serialise the collectives with the backward. [`SideStream::wait_for`] records
//! event `slot` on the compute stream and makes the side stream wait for it, so a collective
//! enqueued next on the side stream reads what the compute stream wrote before the call.
//! Re-recording an event is safe: a stream wait captures the event's state at the time of the
//! wait call. [`SideStream::join_into`] is the way back: the compute stream waits for the side
//! stream's work so far, on the GPU. Every call needs the device's context current on the
//! calling thread.

use std::ffi::c_void;

use cudarc::driver::sys as cu;

use crate::error::{DistError, Result};

fn check(op: &'static str, r: cu::CUresult) -> Result<()> {
    if r == cu::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(DistError::Nccl {
            op,
            reason: format!("CUDA driver error {r:?}"),
        })
    }
}

/// A non-blocking CUDA stream and `slots` events (destroyed on drop).
#[derive(Debug)]
pub struct SideStream {
    stream: cu::CUstream,
    events: Vec<cu::CUevent>,
}

// SAFETY: the handles are plain driver objects of one context; the driver API is thread-safe and
// the owner serialises the calls (the trainer holds the stream behind a mutex).
unsafe impl Send for SideStream {}

impl SideStream {
    /// A new stream with `slots` events, in the context current on this thread.
    pub fn new(slots: usize) -> Result<SideStream> {
        let mut stream: cu::CUstream = std::ptr::null_mut();
        // SAFETY: out-pointer to a local; the flag is a valid stream flag.
        check("cuStreamCreate", unsafe {
            cu::cuStreamCreate(&mut stream, cu::CUstream_flags::CU_STREAM_NON_BLOCKING as u32)
        })?;
        let mut s = SideStream {
            stream,
            events: Vec::with_capacity(slots),
        };
        for _ in 0..slots {
            let mut ev: cu::CUevent = std::ptr::null_mut();
            // SAFETY: out-pointer to a local; timing off (cheaper records and waits).
            check("cuEventCreate", unsafe {
                cu::cuEventCreate(&mut ev, cu::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32)
            })?;
            s.events.push(ev);
        }
        Ok(s)
    }

    /// The raw stream handle (for NCCL calls and `Communicator::wait`).
    pub fn raw(&self) -> *mut c_void {
        self.stream as *mut c_void
    }

    /// Work enqueued on the side stream after this call starts once everything enqueued on
    /// `compute` before it is done (event `slot` recorded on `compute`, waited for here).
    pub fn wait_for(&self, compute: *mut c_void, slot: usize) -> Result<()> {
        self.order(compute as cu::CUstream, self.stream, slot)
    }

    /// Work enqueued on `compute` after this call starts once everything enqueued on the side
    /// stream before it is done (event `slot` recorded on the side stream, waited for by
    /// `compute`): the compute stream reads the collectives' results without the host waiting.
    pub fn join_into(&self, compute: *mut c_void, slot: usize) -> Result<()> {
        self.order(self.stream, compute as cu::CUstream, slot)
    }

    /// Event `slot` recorded on `first`, waited for by `then`.
    fn order(&self, first: cu::CUstream, then: cu::CUstream, slot: usize) -> Result<()> {
        let ev = *self.events.get(slot).ok_or_else(|| DistError::Nccl {
            op: "cuEventRecord",
            reason: format!("event slot {slot} of {}", self.events.len()),
        })?;
        // SAFETY: `ev` and `self.stream` are live handles owned by `self`; the other stream is
        // one of the same context given by the caller (null: the legacy default stream).
        check("cuEventRecord", unsafe { cu::cuEventRecord(ev, first) })?;
        check("cuStreamWaitEvent", unsafe { cu::cuStreamWaitEvent(then, ev, 0) })
    }
}

impl Drop for SideStream {
    fn drop(&mut self) {
        // SAFETY: the handles were created by `new` and are destroyed once; the driver defers
        // the destruction of a stream or event with pending work until it completes.
        unsafe {
            for &ev in &self.events {
                cu::cuEventDestroy_v2(ev);
            }
            cu::cuStreamDestroy_v2(self.stream);
        }
    }
}
