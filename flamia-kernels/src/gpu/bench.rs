//! Attention benchmark on the GPU: the nine packed workloads of `bench/anchors.py` (16 heads,
//! d = 128 by default or 64, causal, 65,536 tokens per row), CUDA-event medians after warm-up of the quantisers,
//! the forward, the backward (dO quantiser + the backward kernels: the v4 fused kernel, or the two
//! v3.1 kernels) and the whole training call.
//! TFLOP/s count the unmasked causal elements only, backward = 2.5 x forward (as anchors.py).

use super::attention::{Attention, BwdKernel, BwdOutputs};
use super::buffer::DeviceBuf;
use super::error::{DriverContext, GpuError, GpuResult};
use super::plan::Plan;
use super::runtime::{Gpu, RawStream, Variant};
use crate::options::{AttnOptions, VarlenShape};
use serde::Serialize;
use std::sync::Arc;

/// Heads of every workload.
pub const HEADS: usize = 16;
/// Head dim of the workloads unless the caller asks for 64 (anchors.py's).
pub const HEAD_DIM: usize = 128;
/// Tokens per packed row.
pub const ROW: usize = 65536;

/// The `lognormal` workload of anchors.py (torch.Generator seed 1234; 36 documents).
const LOGNORMAL: [usize; 36] = [
    1159, 1777, 325, 1422, 525, 2006, 1446, 2519, 796, 14975, 1239, 803, 910, 211, 936, 3171, 801, 2281,
    1083, 193, 858, 3129, 483, 2346, 1381, 1224, 389, 1328, 2928, 437, 2878, 928, 1609, 322, 226, 6492,
];

/// The nine workloads of anchors.py, by name, as document lengths.
pub fn workloads() -> Vec<(&'static str, Vec<usize>)> {
    let rep = |n: usize, l: usize| vec![l; n];
    let mut mixed = vec![8192];
    mixed.extend(rep(224, 256));
    vec![
        ("1x65536", rep(1, 65536)),
        ("4x16384", rep(4, 16384)),
        ("8x8192", rep(8, 8192)),
        ("16x4096", rep(16, 4096)),
        ("32x2048", rep(32, 2048)),
        ("64x1024", rep(64, 1024)),
        ("256x256", rep(256, 256)),
        ("8192+224x256", mixed),
        ("lognormal", LOGNORMAL.to_vec()),
    ]
}

/// A workload by name: one of [`workloads`], or `NxL` for N documents of L tokens (e.g.
/// `1x131072`, the row the memory bar is stated at).
pub fn workload(name: &str) -> Option<Vec<usize>> {
    if let Some((_, lens)) = workloads().into_iter().find(|(n, _)| *n == name) {
        return Some(lens);
    }
    let (n, l) = name.split_once('x')?;
    let (n, l) = (n.parse::<usize>().ok()?, l.parse::<usize>().ok()?);
    (n > 0 && l > 0 && n.checked_mul(l)? <= 1 << 22).then(|| vec![l; n])
}

/// Forward FLOPs of causal attention over `lens` at head dim `hd` (unmasked elements only).
pub fn causal_fwd_flops(lens: &[usize], hd: usize) -> f64 {
    lens.iter()
        .map(|&l| 4.0 * (HEADS * hd) as f64 * (l * (l + 1)) as f64 / 2.0)
        .sum()
}

/// One workload's timings (ms, medians) and rates.
#[derive(Debug, Clone, Serialize)]
pub struct BenchRow {
    pub workload: String,
    /// Key/value heads (query heads: [`HEADS`]; fewer is GQA).
    pub kv_heads: usize,
    pub head_dim: usize,
    pub docs: usize,
    pub tokens: usize,
    pub reps: usize,
    pub quant_ms: f64,
    /// The E4M3 quantiser's bytes read + written ([`super::Attention::input_quant_bytes`]) per
    /// `quant_ms`, in GB/s (NVFP4 launches, where the path has them, are in the time, not the bytes).
    pub quant_gbs: f64,
    pub fwd_ms: f64,
    pub bwd_ms: f64,
    /// Parts of `bwd_ms` timed alone: the dO quantiser (with D), the dQ kernel, the dK/dV kernel.
    pub dograd_ms: f64,
    /// v3.1: the dQ kernel alone; v4: the fused backward's three launches (dO quantiser excluded).
    pub dq_ms: f64,
    /// v3.1: the dK/dV kernel alone; v4: the dQ conversion alone (`bwd_dq_convert`, every head
    /// chunk's; part of `dq_ms`).
    pub dkdv_ms: f64,
    /// True when the v4 fused backward ran.
    pub bwd_v4: bool,
    /// Device memory the call allocates beyond its BF16 inputs and outputs: the quantised Q, K,
    /// V and the gradient workspace (quantised dO, D, the v4 backward's scratch), MiB.
    pub call_mib: f64,
    pub train_ms: f64,
    /// The SM clock (MHz) right after the training call's timing loop, by `clock_probe`: under
    /// the card's power cap the clock falls during a sustained loop, and the call's time with it
    /// (session 33: 64x1024 at 3.1 ms at 1,874 MHz, 4.0 ms at 1,424).
    pub train_mhz: f64,
    /// The SM clock (MHz) right after the forward's timing loop (`fwd_ms`), as [`Self::train_mhz`].
    pub fwd_mhz: f64,
    /// The SM clock (MHz) right after the backward's timing loop (`bwd_ms`), as [`Self::train_mhz`].
    pub bwd_mhz: f64,
    pub fwd_tflops: f64,
    pub bwd_tflops: f64,
    pub train_tflops: f64,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// The host's wall clock, Unix time in ms (0 if the clock is before 1970).
fn unix_ms() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64() * 1e3)
        .unwrap_or(0.0)
}

/// Bytes of one chunk of `sm_copy`'s copy ([`SmCopyBufs::time_ms`]).
const SMCOPY_CHUNK: usize = 16 << 10;

/// The buffers of `bench.cu`'s `sm_copy`: `bytes_in` in [`SMCOPY_CHUNK`] chunks of a pattern
/// (made and uploaded once for every k and stage count), and of each chunk the share that
/// `bytes_out` is of `bytes_in` (a multiple of 16) out, as the quantiser reads and writes.
struct SmCopyBufs {
    pattern: Vec<u8>,
    src: DeviceBuf<u8>,
    dst: DeviceBuf<u8>,
    nchunks: usize,
    out: usize,
}

impl SmCopyBufs {
    fn new(gpu: &Gpu, bytes_in: usize, bytes_out: usize) -> GpuResult<SmCopyBufs> {
        let nchunks = (bytes_in / SMCOPY_CHUNK).max(1);
        let out = (SMCOPY_CHUNK * bytes_out / bytes_in.max(1)) / 16 * 16;
        let pattern: Vec<u8> = (0..nchunks * SMCOPY_CHUNK).map(|i| (i % 251) as u8).collect();
        let src = DeviceBuf::<u8>::from_host(gpu, &pattern)?;
        let dst = DeviceBuf::<u8>::zeros(gpu, (nchunks * out).max(16))?;
        Ok(SmCopyBufs {
            pattern,
            src,
            dst,
            nchunks,
            out,
        })
    }

    /// `sm_copy` on `k` SMs (one CTA each: `stages` x [`SMCOPY_CHUNK`] bytes of shared
    /// memory): the median ms of 10 after 2 warm-ups; then three chunks are checked against the
    /// pattern (a kernel that moved nothing fails).
    fn time_ms(&self, gpu: &Gpu, k: usize, stages: usize) -> GpuResult<f64> {
        let (sp, dp) = (self.src.ptr(), self.dst.ptr());
        let (n, chunk, out, st) = (
            self.nchunks as i64,
            SMCOPY_CHUNK as i32,
            self.out as i32,
            stages.clamp(1, 32) as i32,
        );
        let smem = (st as usize * SMCOPY_CHUNK) as u32;
        let ms = median(time_ms(gpu, 2, 10, &mut || {
            let mut args: [*mut std::ffi::c_void; 6] = [
                &sp as *const u64 as *mut _,
                &dp as *const u64 as *mut _,
                &n as *const i64 as *mut _,
                &chunk as *const i32 as *mut _,
                &out as *const i32 as *mut _,
                &st as *const i32 as *mut _,
            ];
            // SAFETY: the six pointers match sm_copy(const u8*, u8*, long long, int, int, int);
            // src holds nchunks chunks, dst nchunks x out bytes, smem the ring of st chunks.
            unsafe { launch_bench_kernel_smem(gpu, "sm_copy", (k.max(1) as u32, 32, smem), &mut args) }
        })?);
        let (got, out, nchunks) = (self.dst.to_host()?, self.out, self.nchunks);
        for c in [0, nchunks / 2, nchunks - 1] {
            if got[c * out..][..out] != self.pattern[c * SMCOPY_CHUNK..][..out] {
                return Err(GpuError::NotSupported(format!(
                    "sm_copy on {k} SMs, {stages} stages: chunk {c} of {nchunks} did not arrive"
                )));
            }
        }
        Ok(ms)
    }
}

/// The comma-separated list of counts in the environment variable `var`
/// (`FLAMIA_BENCH_SMCOPY=k1,k2,..` and its `_STAGES`; unset, empty or unparsable: `None`).
fn env_list(var: &str) -> Option<Vec<usize>> {
    parse_list(std::env::var(var).ok().as_deref())
}

/// [`env_list`] of the variable's value.
fn parse_list(v: Option<&str>) -> Option<Vec<usize>> {
    let ks: Option<Vec<usize>> = v?.split(',').map(|k| k.trim().parse().ok()).collect();
    ks.filter(|ks| !ks.is_empty())
}

/// Runs `f` `warm` times, then `reps` times between CUDA events on the default stream.
fn time_ms(gpu: &Gpu, warm: usize, reps: usize, f: &mut dyn FnMut() -> GpuResult<()>) -> GpuResult<Vec<f64>> {
    Ok(time_ms_stamped(gpu, warm, reps, f, &mut |_| Ok(()))?
        .into_iter()
        .map(|(_, ms)| ms)
        .collect())
}

/// [`time_ms`] with each repetition's host wall-clock start (Unix time, ms) beside its time, so
/// a slow sample can be set against the GPU's clock log (`FLAMIA_BENCH_SAMPLES=1`); `after(i)`
/// is enqueued after repetition i's closing event, outside its time.
fn time_ms_stamped(
    gpu: &Gpu,
    warm: usize,
    reps: usize,
    f: &mut dyn FnMut() -> GpuResult<()>,
    after: &mut dyn FnMut(usize) -> GpuResult<()>,
) -> GpuResult<Vec<(f64, f64)>> {
    let stream = gpu.context().default_stream();
    for _ in 0..warm {
        f()?;
    }
    let mut out = Vec::with_capacity(reps);
    let flags = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
    for i in 0..reps {
        let now = unix_ms();
        let a = stream.record_event(flags).ctx("cuEventRecord")?;
        f()?;
        let b = stream.record_event(flags).ctx("cuEventRecord")?;
        after(i)?;
        out.push((now, a.elapsed_ms(&b).ctx("cuEventElapsedTime")? as f64));
    }
    Ok(out)
}

/// Launches `bench.cu`'s kernel `name` on the default stream with `grid` x `block` threads and
/// its parameters as `args` (one pointer per parameter, each to a value of the parameter's type).
///
/// # Safety
/// `args` must match the kernel's parameter list in count, order and types, and every buffer the
/// kernel writes through them must be large enough for `grid` x `block` threads.
unsafe fn launch_bench_kernel(
    gpu: &Gpu,
    name: &str,
    grid: u32,
    block: u32,
    args: &mut [*mut std::ffi::c_void],
) -> GpuResult<()> {
    // SAFETY: the caller's contract, no dynamic shared memory
    unsafe { launch_bench_kernel_smem(gpu, name, (grid, block, 0), args) }
}

/// [`launch_bench_kernel`] with `smem` bytes of dynamic shared memory: `geometry` = (grid,
/// block, smem).
///
/// # Safety
/// As [`launch_bench_kernel`], and the kernel may use at most `smem` bytes of dynamic shared
/// memory.
unsafe fn launch_bench_kernel_smem(
    gpu: &Gpu,
    name: &str,
    geometry: (u32, u32, u32),
    args: &mut [*mut std::ffi::c_void],
) -> GpuResult<()> {
    let (grid, block, smem) = geometry;
    let f = gpu.function("bench.cu", &Variant::new(), name, smem)?;
    // SAFETY: the caller's contract above
    unsafe {
        cudarc::driver::result::launch_kernel(
            f.cu_function(),
            (grid, 1, 1),
            (block, 1, 1),
            smem,
            std::ptr::null_mut(),
            args,
        )
    }
    .ctx(&format!("cuLaunchKernel({name})"))
}

/// `clock_probe` (bench.cu) launched on the default stream into `out[2 i], out[2 i + 1]`: SM
/// cycles over 100 us of the global timer, one thread, after whatever the stream ran before.
/// (The timer may tick only every microsecond: over the 20 us used until session 41 that was up
/// to 5% of the reading, over 100 us 1%; still short against the power manager's millisecond
/// reaction, so the clock is the one the loop left.)
fn launch_clock_probe(gpu: &Gpu, out: &DeviceBuf<u64>, i: usize) -> GpuResult<()> {
    let (ptr, ns) = (out.ptr() + 16 * i as u64, 100_000i64);
    let mut args: [*mut std::ffi::c_void; 2] = [&ptr as *const u64 as *mut _, &ns as *const i64 as *mut _];
    assert!(2 * i + 1 < out.len(), "clock_probe slot {i} outside its buffer");
    // SAFETY: the two pointers match clock_probe(u64*, long long); slot i lies in `out` (asserted).
    unsafe { launch_bench_kernel(gpu, "clock_probe", 1, 32, &mut args) }
}

/// The SM clocks (MHz) [`launch_clock_probe`] measured in `out`'s slots, in order.
fn probed_mhz(out: &DeviceBuf<u64>) -> GpuResult<Vec<f64>> {
    Ok(out
        .to_host()?
        .chunks(2)
        .map(|w| w[0] as f64 / w[1].max(1) as f64 * 1e3)
        .collect())
}

/// Bytes each way of [`device_copy_gbs`]'s copy: 1 GiB, more than the Q/K/V quantiser reads at
/// 65,536 tokens, 16 heads and d = 128 (805 MB), so the rate is the DRAM's, not the L2's.
pub const COPY_BYTES: usize = 1 << 30;

/// The device's copy rate in GB/s, bytes read + written (as the quantiser's GB/s counts them):
/// `cuMemcpyDtoDAsync` of `bytes` on the default stream, 3 warm-up copies, the median of 20.
/// The quantiser's bar (issue 12: >= 80% of the copy bandwidth) is read against this rate from
/// the same device call, before and after the workloads (the power cap moves both).
pub fn device_copy_gbs(gpu: &Gpu, bytes: usize) -> GpuResult<f64> {
    let stream = gpu.context().default_stream();
    let src = stream.alloc_zeros::<u8>(bytes.max(1)).ctx("cuMemAlloc")?;
    let mut dst = stream.alloc_zeros::<u8>(bytes.max(1)).ctx("cuMemAlloc")?;
    let ms = median(time_ms(gpu, 3, 20, &mut || {
        stream.memcpy_dtod(&src, &mut dst).ctx("cuMemcpyDtoDAsync")
    })?);
    Ok(2.0 * bytes.max(1) as f64 / ms / 1e6)
}

/// The SM clock (MHz) right after the stream's work so far, by one [`launch_clock_probe`]:
/// the clock a timing loop ended at, which the driver's sampled clock reports late (session 33:
/// nvidia-smi at 20 ms showed 1,965 MHz while the probe measured the calls slowing at ~1,450).
pub fn sm_mhz_now(gpu: &Gpu) -> GpuResult<f64> {
    let out = DeviceBuf::<u64>::zeros(gpu, 2)?;
    launch_clock_probe(gpu, &out, 0)?;
    Ok(probed_mhz(&out)?[0])
}

/// Every repetition of `f` timed (synchronised, as [`time_ms`]) with the SM clock (MHz) right
/// after it by [`launch_clock_probe`] (`FLAMIA_BENCH_SAMPLES=1`): whether a slow call ran at a
/// lower clock.
fn clock_after_mhz(
    gpu: &Gpu,
    reps: usize,
    f: &mut dyn FnMut() -> GpuResult<()>,
) -> GpuResult<Vec<(f64, f64)>> {
    let out = DeviceBuf::<u64>::zeros(gpu, 2 * reps)?;
    let times = time_ms_stamped(gpu, 0, reps, f, &mut |i| launch_clock_probe(gpu, &out, i))?;
    Ok(times
        .into_iter()
        .map(|(_, ms)| ms)
        .zip(probed_mhz(&out)?)
        .collect())
}

/// `FLAMIA_BENCH_ENERGY=1` (a diagnostic): `f` queued back to back for about `secs` seconds
/// (`per_call_ms` sizes the count; one synchronisation at the end), then the SM clock by
/// [`launch_clock_probe`]. Returns the window's host wall-clock start and end (Unix ms), the
/// calls and the clock after: a power log sampled beside it (nvidia-smi, `bench/energy.py`) gives
/// the phase's watts, and watts x ms per call its joules per call, which under the card's power
/// cap is what sets the clock the call runs at.
fn sustained_window(
    gpu: &Gpu,
    secs: f64,
    per_call_ms: f64,
    f: &mut dyn FnMut() -> GpuResult<()>,
) -> GpuResult<(f64, f64, usize, f64)> {
    let stream = gpu.context().default_stream();
    let calls = ((secs * 1e3 / per_call_ms.max(1e-3)) as usize).clamp(1, 200_000);
    stream.synchronize().ctx("cuStreamSynchronize")?;
    let t0 = unix_ms();
    for _ in 0..calls {
        f()?;
    }
    stream.synchronize().ctx("cuStreamSynchronize")?;
    let t1 = unix_ms();
    // (microseconds after the last call: the clock has no time to move)
    Ok((t0, t1, calls, sm_mhz_now(gpu)?))
}

/// `FLAMIA_BENCH_HOST=1` (a diagnostic): the host's time to enqueue one call of `f` and the
/// call's GPU time when `reps` calls are queued back to back (events between them, one
/// synchronisation at the end), both medians. Where the enqueue takes longer than the GPU's
/// first kernels, the table's per-call synchronised timing (the anchors' way too) includes host
/// time that queued calls, as in training, hide.
fn host_and_queued_ms(gpu: &Gpu, reps: usize, f: &mut dyn FnMut() -> GpuResult<()>) -> GpuResult<(f64, f64)> {
    let stream = gpu.context().default_stream();
    let flags = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
    stream.synchronize().ctx("cuStreamSynchronize")?;
    let mut host = Vec::with_capacity(reps);
    let mut events = vec![stream.record_event(flags).ctx("cuEventRecord")?];
    for _ in 0..reps {
        let t = std::time::Instant::now();
        f()?;
        host.push(t.elapsed().as_secs_f64() * 1e3);
        events.push(stream.record_event(flags).ctx("cuEventRecord")?);
    }
    let mut queued = Vec::with_capacity(reps);
    for w in events.windows(2) {
        queued.push(w[0].elapsed_ms(&w[1]).ctx("cuEventElapsedTime")? as f64);
    }
    Ok((median(host), median(queued)))
}

/// `FLAMIA_BENCH_HOST=1`: the training call as its `phases` in order, one call per repetition
/// (synchronised, as the table's), with an event between each two phases: each phase's median
/// time inside the call, to tell which kernel carries a slow mode of the whole call.
fn phases_in_call_ms(
    gpu: &Gpu,
    reps: usize,
    phases: &mut [&mut dyn FnMut() -> GpuResult<()>],
) -> GpuResult<Vec<f64>> {
    let stream = gpu.context().default_stream();
    let flags = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
    let mut times = vec![Vec::with_capacity(reps); phases.len()];
    for _ in 0..reps {
        let mut events = vec![stream.record_event(flags).ctx("cuEventRecord")?];
        for ph in phases.iter_mut() {
            ph()?;
            events.push(stream.record_event(flags).ctx("cuEventRecord")?);
        }
        for (i, w) in events.windows(2).enumerate() {
            times[i].push(w[0].elapsed_ms(&w[1]).ctx("cuEventElapsedTime")? as f64);
        }
    }
    Ok(times.into_iter().map(median).collect())
}

/// Fills `buf` (BF16) with N(0, 1) on the device.
fn fill_normal(gpu: &Gpu, buf: &DeviceBuf<u16>, seed: u32) -> GpuResult<()> {
    #[repr(C)]
    struct P {
        out: u64,
        n: i64,
        seed: u32,
        sigma: f32,
    }
    // The kernel takes four scalar parameters; pass them one by one.
    let p = P {
        out: buf.ptr(),
        n: buf.len() as i64,
        seed,
        sigma: 1.0,
    };
    let mut args: [*mut std::ffi::c_void; 4] = [
        &p.out as *const u64 as *mut _,
        &p.n as *const i64 as *mut _,
        &p.seed as *const u32 as *mut _,
        &p.sigma as *const f32 as *mut _,
    ];
    // SAFETY: the four pointers match fill_normal_bf16(u16*, long long, u32, float); the kernel
    // strides over buf's n elements whatever the grid.
    unsafe { launch_bench_kernel(gpu, "fill_normal_bf16", 1024, 256, &mut args) }
}

/// Benchmarks one workload with `opts` (causal), on fresh random inputs: [`HEADS`] query heads
/// and `kv_heads` key/value heads (a divisor of [`HEADS`]; fewer is GQA), head dim `hd`.
pub fn run_workload(
    gpu: &Arc<Gpu>,
    opts: AttnOptions,
    name: &str,
    lens: &[usize],
    kv_heads: usize,
    hd: usize,
) -> GpuResult<BenchRow> {
    let shape = VarlenShape::from_lens(lens, HEADS, kv_heads, hd)?;
    let t = shape.tokens();
    let (n, nkv) = (t * HEADS * hd, t * kv_heads * hd);
    let attn = Attention::new(gpu.clone(), opts)?;
    let plan = Plan::new(gpu, &shape, opts.causal)?;
    // q, k, v, o, dO, dQ, dK, dV: the K/V side has `kv_heads` heads
    let bufs: Vec<DeviceBuf<u16>> = [n, nkv, nkv, n, n, n, nkv, nkv]
        .into_iter()
        .map(|len| DeviceBuf::zeros(gpu, len))
        .collect::<GpuResult<_>>()?;
    let (q, k, v, o, d_o, dq, dk, dv) = (
        &bufs[0], &bufs[1], &bufs[2], &bufs[3], &bufs[4], &bufs[5], &bufs[6], &bufs[7],
    );
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u32)
        .unwrap_or(7);
    for (i, b) in [q, k, v, d_o].into_iter().enumerate() {
        fill_normal(gpu, b, seed.wrapping_add(i as u32 * 1000003))?;
    }
    if let Some((mode, clusters)) = attn.backward_pairs(&plan)? {
        eprintln!("{name}: backward in CTA pairs (FLAMIA_BWD_PAIR={mode}), {clusters} clusters of two");
    }
    let lse = DeviceBuf::<f32>::zeros(gpu, t * HEADS)?;
    let saved = attn.alloc_saved(&plan)?;
    let ws = attn.alloc_grad(&plan)?;
    let s = RawStream(std::ptr::null_mut());
    let mut quant = || attn.quantize_inputs(s, &plan, q.ptr(), k.ptr(), v.ptr(), &saved);
    let mut fwd = || attn.forward_quantized(s, &plan, &saved, o.ptr(), lse.ptr());
    let mut bwd = || -> GpuResult<()> {
        attn.quantize_grad(s, &plan, d_o.ptr(), o.ptr(), &ws)?;
        attn.backward_quantized(s, &plan, &saved, &ws, lse.ptr(), dq.ptr(), dk.ptr(), dv.ptr())
    };
    let grads = BwdOutputs {
        lse: lse.ptr(),
        dq: dq.ptr(),
        dk: dk.ptr(),
        dv: dv.ptr(),
    };
    let mut dograd = || attn.quantize_grad(s, &plan, d_o.ptr(), o.ptr(), &ws);
    // v4: the fused backward's launches in the dq column, their dQ conversion alone in dkdv
    let v4 = attn.uses_backward_v4();
    let (first, second) = if v4 {
        (BwdKernel::Fused, BwdKernel::DqConvert)
    } else {
        (BwdKernel::Dq, BwdKernel::DkDv)
    };
    let mut dq_only = || attn.backward_kernel(first, s, &plan, &saved, &ws, grads);
    let mut dkdv_only = || attn.backward_kernel(second, s, &plan, &saved, &ws, grads);
    // one full call first (compiles the modules), then size the repetitions to ~1 s per phase
    quant()?;
    fwd()?;
    bwd()?;
    let probe = time_ms(gpu, 0, 1, &mut || {
        quant()?;
        fwd()?;
        bwd()
    })?[0];
    let reps = ((1000.0 / probe.max(0.01)) as usize).clamp(5, 30);
    let quant_ms = median(time_ms(gpu, 2, reps, &mut quant)?);
    let fwd_ms = median(time_ms(gpu, 2, reps, &mut fwd)?);
    let fwd_mhz = sm_mhz_now(gpu)?;
    let bwd_ms = median(time_ms(gpu, 2, reps, &mut bwd)?);
    let bwd_mhz = sm_mhz_now(gpu)?;
    let dograd_ms = median(time_ms(gpu, 2, reps, &mut dograd)?);
    let dq_ms = median(time_ms(gpu, 2, reps, &mut dq_only)?);
    // (v4: after dq_only, so the accumulator holds a backward's sums)
    let dkdv_ms = median(time_ms(gpu, 2, reps, &mut dkdv_only)?);
    let train = time_ms_stamped(
        gpu,
        2,
        reps,
        &mut || {
            quant()?;
            fwd()?;
            bwd()
        },
        &mut |_| Ok(()),
    )?;
    if super::env_on("FLAMIA_BENCH_SAMPLES") {
        // a diagnostic of the slow modes: every training call's start and time, in order
        let t0 = train.first().map_or(0.0, |s| s.0);
        let list: Vec<String> = train
            .iter()
            .map(|(at, ms)| format!("+{:.1}:{ms:.3}", at - t0))
            .collect();
        eprintln!(
            "{name}: train samples from unix ms {t0:.1} (+ms since:ms) {}",
            list.join(" ")
        );
        let clocked = clock_after_mhz(gpu, reps, &mut || {
            quant()?;
            fwd()?;
            bwd()
        })?;
        let list: Vec<String> = clocked
            .iter()
            .map(|(ms, mhz)| format!("{ms:.3}@{mhz:.0}"))
            .collect();
        eprintln!(
            "{name}: train ms @ SM MHz just after the call: {}",
            list.join(" ")
        );
    }
    let train_ms = median(train.into_iter().map(|(_, ms)| ms).collect());
    let train_mhz = sm_mhz_now(gpu)?;
    if super::env_on("FLAMIA_BENCH_HOST") {
        let (host, queued) = host_and_queued_ms(gpu, reps, &mut || {
            quant()?;
            fwd()?;
            bwd()
        })?;
        let inside = phases_in_call_ms(
            gpu,
            reps,
            &mut [&mut quant, &mut fwd, &mut dograd, &mut || {
                attn.backward_quantized(s, &plan, &saved, &ws, lse.ptr(), dq.ptr(), dk.ptr(), dv.ptr())
            }],
        )?;
        eprintln!(
            "{name}: training call {train_ms:.3} ms (synchronised per call, the table's), {queued:.3} ms \
             queued back to back; host enqueue {host:.3} ms a call; inside one call: quantiser {:.3}, \
             forward {:.3}, dO quantiser {:.3}, backward {:.3} ms (medians of {reps})",
            inside[0], inside[1], inside[2], inside[3]
        );
    }
    if let Some(ks) = env_list("FLAMIA_BENCH_SMCOPY") {
        // what k SMs can move by bulk copies, the Q/K/V quantiser's bytes (session 49: today's
        // quantiser moves 23-28 GB/s per SM on 16-48 SMs, ~25 on all of them)
        let bytes_in = t * (HEADS + 2 * kv_heads) * hd * 2; // (Q, K, V in BF16)
        let bytes_out = attn.input_quant_bytes(&plan).saturating_sub(bytes_in);
        let stages = env_list("FLAMIA_BENCH_SMCOPY_STAGES").unwrap_or_else(|| vec![4, 12]);
        let bufs = SmCopyBufs::new(gpu, bytes_in, bytes_out)?;
        for k in ks {
            for &st in &stages {
                let ms = bufs.time_ms(gpu, k, st)?;
                let gbs = (bytes_in + bytes_out) as f64 / ms / 1e6;
                eprintln!(
                    "{name}: sm_copy on {k} SMs, {st} stages of {} KB: {bytes_in} B in, {bytes_out} B out in \
                     {ms:.3} ms: {gbs:.0} GB/s, {:.1} GB/s per SM",
                    SMCOPY_CHUNK >> 10,
                    gbs / k.max(1) as f64
                );
            }
        }
    }
    if super::env_on("FLAMIA_BENCH_ENERGY") {
        // each phase alone, then the whole call, ~1.5 s queued back to back apiece (the power
        // log's samples every 20-100 ms give a window ~15 of them)
        let secs = super::env_number::<f64>("FLAMIA_BENCH_ENERGY_SECS").unwrap_or(1.5);
        let labels = [
            "quantiser",
            "forward",
            "dO quantiser",
            "backward",
            "training call",
        ];
        for (i, phase) in labels.into_iter().enumerate() {
            let (t0, t1, calls, mhz) = match i {
                0 => sustained_window(gpu, secs, quant_ms, &mut quant)?,
                1 => sustained_window(gpu, secs, fwd_ms, &mut fwd)?,
                2 => sustained_window(gpu, secs, dograd_ms, &mut dograd)?,
                3 => sustained_window(gpu, secs, if v4 { dq_ms } else { dq_ms + dkdv_ms }, &mut || {
                    attn.backward_quantized(s, &plan, &saved, &ws, lse.ptr(), dq.ptr(), dk.ptr(), dv.ptr())
                })?,
                _ => sustained_window(gpu, secs, train_ms, &mut || {
                    quant()?;
                    fwd()?;
                    bwd()
                })?,
            };
            eprintln!(
                "energy window: {name} | {phase} | unix ms {t0:.1} {t1:.1} | calls {calls} | {:.4} ms a call | SM {mhz:.0} MHz after",
                (t1 - t0) / calls as f64
            );
        }
    }
    let ff = causal_fwd_flops(lens, hd);
    Ok(BenchRow {
        workload: name.to_string(),
        kv_heads,
        head_dim: hd,
        docs: lens.len(),
        tokens: t,
        reps,
        quant_ms,
        quant_gbs: attn.input_quant_bytes(&plan) as f64 / quant_ms / 1e6,
        fwd_ms,
        bwd_ms,
        dograd_ms,
        dq_ms,
        dkdv_ms,
        bwd_v4: v4,
        call_mib: (attn.saved_bytes(&plan) + ws.bytes()) as f64 / (1 << 20) as f64,
        train_ms,
        train_mhz,
        fwd_mhz,
        bwd_mhz,
        fwd_tflops: ff / fwd_ms / 1e9,
        bwd_tflops: 2.5 * ff / bwd_ms / 1e9,
        train_tflops: 3.5 * ff / train_ms / 1e9,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn count_lists_parse_or_are_refused_whole() {
        assert_eq!(parse_list(Some("16, 32,48")), Some(vec![16, 32, 48]));
        assert_eq!(parse_list(Some("24")), Some(vec![24]));
        assert_eq!(parse_list(Some("16,x")), None);
        assert_eq!(parse_list(Some("")), None);
        assert_eq!(parse_list(None), None);
    }

    #[test]
    fn every_workload_is_one_full_row() {
        let w = workloads();
        assert_eq!(w.len(), 9);
        for (name, lens) in &w {
            assert_eq!(lens.iter().sum::<usize>(), ROW, "{name}");
        }
        assert_eq!(w[8].1.len(), 36);
    }

    #[test]
    fn flops_match_anchors_py() {
        // anchors.py: 3.5 * sum(4 H D l (l + 1) / 2)
        let f = causal_fwd_flops(&[65536], 128);
        assert_eq!(f, 4.0 * 16.0 * 128.0 * 65536.0 * 65537.0 / 2.0);
    }

    #[test]
    fn workloads_by_name_or_documents_x_length() {
        assert_eq!(workload("1x65536"), Some(vec![65536]));
        assert_eq!(workload("8192+224x256").map(|l| l.len()), Some(225));
        assert_eq!(workload("1x131072"), Some(vec![131072]));
        assert_eq!(workload("3x100"), Some(vec![100; 3]));
        for bad in ["", "x", "0x5", "5x0", "ax5", "1x99999999", "lognormalx"] {
            assert_eq!(workload(bad), None, "{bad}");
        }
    }
}
