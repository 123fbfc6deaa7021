//! A self-contained NCCL check on real GPUs: allocate a buffer on `cuda:<device>`, fill it
//! with `rank + 1`, all-reduce (sum) through [`Communicator`], verify every element equals
//! `world_size * (world_size + 1) / 2`, then time `iters` all-reduces and report bus bandwidth
//! (NCCL-tests' definition: `algbw * 2 (n - 1) / n`). Used by `flamia-dist nccl-check` and the
//! one-GPU ignored test.

use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::{CudaContext, DevicePtr};

use crate::bucket::ReduceDtype;
use crate::error::{DistError, Result};
use crate::health::Health;
use crate::nccl::{CommOptions, Communicator, NcclId, ReduceOp};

/// Outcome of [`all_reduce_check`].
#[derive(Debug, Clone, serde::Serialize)]
pub struct CheckReport {
    pub rank: usize,
    pub world_size: usize,
    pub numel: usize,
    pub bytes: usize,
    pub iters: usize,
    /// Seconds per all-reduce (mean over `iters`).
    pub seconds: f64,
    /// Algorithm bandwidth, GB/s (bytes / time).
    pub algbw_gbs: f64,
    /// Bus bandwidth, GB/s.
    pub busbw_gbs: f64,
}

fn cuda(op: &'static str) -> impl Fn(cudarc::driver::DriverError) -> DistError {
    move |e| DistError::Nccl {
        op,
        reason: format!("CUDA: {e:?}"),
    }
}

/// Run the check on CUDA device `device` (f32 sum of `numel` elements).
pub fn all_reduce_check(
    id: &NcclId,
    rank: usize,
    world_size: usize,
    device: usize,
    numel: usize,
    iters: usize,
    health: Option<Arc<Health>>,
) -> Result<CheckReport> {
    let ctx = CudaContext::new(device).map_err(cuda("cuCtx"))?;
    ctx.bind_to_thread().map_err(cuda("bind"))?;
    let stream = ctx.new_stream().map_err(cuda("stream"))?;
    let opts = CommOptions {
        timeout: Duration::from_secs(120),
        ..CommOptions::default()
    };
    let comm = Communicator::new(id, rank, world_size, opts, health)?;
    let host = vec![(rank + 1) as f32; numel];
    let buf = stream.clone_htod(&host).map_err(cuda("htod"))?;
    let raw_stream = stream.cu_stream() as *mut std::ffi::c_void;
    {
        let (ptr, _sync) = buf.device_ptr(&stream);
        // SAFETY: `buf` holds `numel` f32 on this device and outlives the wait below.
        unsafe { comm.all_reduce(ptr, ptr, numel, ReduceDtype::F32, ReduceOp::Sum, raw_stream)? };
        comm.wait(raw_stream, "all_reduce")?;
    }
    let out = stream.clone_dtoh(&buf).map_err(cuda("dtoh"))?;
    let want = (world_size * (world_size + 1) / 2) as f32;
    if let Some((i, v)) = out.iter().enumerate().find(|(_, v)| **v != want) {
        return Err(DistError::Nccl {
            op: "verify",
            reason: format!("element {i} is {v}, expected {want}"),
        });
    }
    let start = Instant::now();
    for _ in 0..iters {
        let (ptr, _sync) = buf.device_ptr(&stream);
        // SAFETY: as above.
        unsafe { comm.all_reduce(ptr, ptr, numel, ReduceDtype::F32, ReduceOp::Sum, raw_stream)? };
    }
    comm.wait(raw_stream, "all_reduce")?;
    let seconds = start.elapsed().as_secs_f64() / iters.max(1) as f64;
    let bytes = numel * 4;
    let algbw = bytes as f64 / seconds / 1e9;
    let n = world_size as f64;
    Ok(CheckReport {
        rank,
        world_size,
        numel,
        bytes,
        iters,
        seconds,
        algbw_gbs: algbw,
        busbw_gbs: algbw * 2.0 * (n - 1.0) / n,
    })
}
