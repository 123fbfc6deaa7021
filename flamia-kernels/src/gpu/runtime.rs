//! Kernel runtime: the CUDA sources embedded in the crate, NVRTC compilation for the device's
//! architecture (`sm_90a` on Hopper), our own `#include "x.cuh"` resolved from the embedded headers,
//! variants as `-D` defines, and one loaded module per (source, variant, arch), its PTX kept on
//! disk for the next process (`kcache`).
//!
//! Nothing here needs CUDA at build time: the driver and NVRTC are loaded at run time (cudarc's
//! dynamic loading) and their absence is a typed [`GpuError`], never a panic.

use super::error::{DriverContext, GpuError, GpuResult};
use super::kcache;
use cudarc::driver::{sys, CudaContext, CudaFunction, CudaModule};
use cudarc::nvrtc::{CompileError, CompileOptions, Ptx};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::ffi::c_void;
use std::sync::{Arc, Mutex};

/// Every CUDA file of the crate, by the name kernels `#include` it with.
const SOURCES: &[(&str, &str)] = &[
    ("common.cuh", include_str!("../../cuda/common.cuh")),
    ("wgmma.cuh", include_str!("../../cuda/wgmma.cuh")),
    ("formats.cuh", include_str!("../../cuda/formats.cuh")),
    ("attn_common.cuh", include_str!("../../cuda/attn_common.cuh")),
    ("tma.cuh", include_str!("../../cuda/tma.cuh")),
    ("sched.cuh", include_str!("../../cuda/sched.cuh")),
    ("softmax.cuh", include_str!("../../cuda/softmax.cuh")),
    ("epilogue.cuh", include_str!("../../cuda/epilogue.cuh")),
    ("xpose.cuh", include_str!("../../cuda/xpose.cuh")),
    ("quant.cu", include_str!("../../cuda/quant.cu")),
    ("attn_fwd.cu", include_str!("../../cuda/attn_fwd.cu")),
    ("attn_fwd_v4.cu", include_str!("../../cuda/attn_fwd_v4.cu")),
    ("attn_bwd.cu", include_str!("../../cuda/attn_bwd.cu")),
    ("attn_bwd_v4.cu", include_str!("../../cuda/attn_bwd_v4.cu")),
    ("bench.cu", include_str!("../../cuda/bench.cu")),
];

/// Environment variable naming a directory whose files replace the embedded sources of the same
/// name (kernel development: try or A/B a kernel change without rebuilding the binary, e.g.
/// `bench/ab_kernels.sh`). Unset in normal use; the runtime logs once when it is set.
pub const SOURCE_DIR_ENV: &str = "FLAMIA_CUDA_DIR";

/// The text of source `name`: the file `$FLAMIA_CUDA_DIR/name` when that variable is set and the
/// file exists, else the embedded copy.
fn source_text(name: &str) -> Option<std::borrow::Cow<'static, str>> {
    let dir = std::env::var_os(SOURCE_DIR_ENV);
    if let Some(d) = &dir {
        if !std::path::Path::new(d).is_dir() {
            static MISSING: std::sync::Once = std::sync::Once::new();
            MISSING.call_once(|| {
                eprintln!(
                    "flamia: {SOURCE_DIR_ENV}={} is not a directory; using the embedded kernel sources",
                    std::path::Path::new(d).display()
                )
            });
        }
    }
    let text = source_from(name, dir.as_deref().map(std::path::Path::new))?;
    if let (Some(dir), std::borrow::Cow::Owned(_)) = (&dir, &text) {
        static SAID: std::sync::Once = std::sync::Once::new();
        SAID.call_once(|| {
            eprintln!(
                "flamia: kernel sources from {} ({SOURCE_DIR_ENV}), not the embedded ones",
                std::path::Path::new(dir).display()
            )
        });
    }
    Some(text)
}

/// Source `name` from `dir` when given and the file is there, else the embedded copy; `None` for
/// a name that is not one of the crate's sources.
fn source_from(name: &str, dir: Option<&std::path::Path>) -> Option<std::borrow::Cow<'static, str>> {
    let builtin = SOURCES.iter().find(|(n, _)| *n == name).map(|(_, s)| *s)?;
    match dir.and_then(|d| std::fs::read_to_string(d.join(name)).ok()) {
        Some(text) => Some(std::borrow::Cow::Owned(text)),
        None => Some(std::borrow::Cow::Borrowed(builtin)),
    }
}

fn known() -> String {
    SOURCES.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", ")
}

/// The source of `name` with every `#include "..."` of an embedded header replaced by that
/// header (each at most once: headers are `#pragma once`), with `#line` markers so NVRTC's log
/// names the right file and line. `#include <...>` (system headers) are left to NVRTC.
pub fn resolve_includes(name: &str) -> GpuResult<String> {
    let mut out = String::new();
    let mut seen = HashSet::new();
    inline(name, "the kernel cache", &mut out, &mut seen)?;
    Ok(out)
}

fn inline(name: &str, from: &str, out: &mut String, seen: &mut HashSet<String>) -> GpuResult<()> {
    let text = source_text(name).ok_or_else(|| GpuError::UnknownSource {
        name: name.to_string(),
        from: from.to_string(),
        known: known(),
    })?;
    if !seen.insert(name.to_string()) {
        return Ok(());
    }
    out.push_str(&format!("#line 1 \"{name}\"\n"));
    for (i, line) in text.lines().enumerate() {
        let t = line.trim_start();
        if t.starts_with("#pragma once") {
            out.push('\n');
            continue;
        }
        if let Some(rest) = t.strip_prefix("#include") {
            let rest = rest.trim();
            if let Some(inc) = rest.strip_prefix('"').and_then(|r| r.split('"').next()) {
                inline(inc, name, out, seen)?;
                out.push_str(&format!("#line {} \"{name}\"\n", i + 2));
                continue;
            }
        }
        out.push_str(line);
        out.push('\n');
    }
    Ok(())
}

/// A specialisation of a kernel source: `-D NAME=VALUE` defines. Ordered, so equal variants
/// have equal keys.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Variant(BTreeMap<String, String>);

impl Variant {
    /// The empty variant (no defines).
    pub fn new() -> Self {
        Variant::default()
    }

    /// Adds `-D name=value`.
    pub fn define(mut self, name: &str, value: impl ToString) -> Self {
        self.0.insert(name.to_string(), value.to_string());
        self
    }

    /// `NAME=VALUE,...`, the key the cache and error messages use.
    pub fn key(&self) -> String {
        self.0
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(",")
    }

    fn options(&self) -> Vec<String> {
        self.0.iter().map(|(k, v)| format!("-D{k}={v}")).collect()
    }
}

/// The NVRTC architecture for a compute capability: the `a` targets (wgmma, setmaxnreg) on
/// Hopper and Blackwell datacenter parts, the plain one elsewhere.
pub fn arch_for(major: i32, minor: i32) -> &'static str {
    match (major, minor) {
        (9, 0) => "sm_90a",
        (10, 0) => "sm_100a",
        (8, 0) => "sm_80",
        (8, 6) => "sm_86",
        (8, 9) => "sm_89",
        _ => "sm_unsupported",
    }
}

/// Kernel modules this process has built (NVRTC's PTX, or the disk cache's, then the driver's
/// load, which compiles the PTX to SASS unless its own per-machine cache has it) and the
/// nanoseconds that took, updated together: [`kernel_builds`].
static BUILDS: Mutex<(u64, u64)> = Mutex::new((0, 0));

/// Kernel modules built and the wall seconds the builds took (see [`kernel_builds`]).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct KernelBuilds {
    /// Modules built (each (source, variant) once per GPU and process, on its first launch).
    pub modules: u64,
    /// Wall seconds those builds took.
    pub seconds: f64,
}

impl KernelBuilds {
    /// The builds after `earlier` (an earlier [`kernel_builds`] reading) up to `self`.
    pub fn since(&self, earlier: &KernelBuilds) -> KernelBuilds {
        KernelBuilds {
            modules: self.modules.saturating_sub(earlier.modules),
            seconds: (self.seconds - earlier.seconds).max(0.0),
        }
    }
}

/// The kernel modules this process has built so far and the seconds those builds took. A build
/// of a large variant takes seconds when neither the disk cache ([`super::kcache`]) nor the
/// driver's own cache has it, so a caller that times its work (the trainer's step times) can tell
/// a build from a slow step: take a reading before and after, then [`KernelBuilds::since`].
pub fn kernel_builds() -> KernelBuilds {
    let (modules, nanos) = *BUILDS.lock().unwrap_or_else(|p| p.into_inner());
    KernelBuilds {
        modules,
        seconds: nanos as f64 * 1e-9,
    }
}

/// True when libnvrtc can be loaded.
pub fn nvrtc_available() -> bool {
    // SAFETY: only tries to dlopen the library by its usual names.
    unsafe { cudarc::nvrtc::sys::is_culib_present() }
}

/// True when libcuda can be loaded.
pub fn driver_available() -> bool {
    // SAFETY: only tries to dlopen the library by its usual names.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

/// Compiles embedded source `source` (includes resolved) for `arch` with the variant's defines.
/// Needs NVRTC only, no GPU.
pub fn compile_ptx(source: &str, variant: &Variant, arch: &'static str) -> GpuResult<Ptx> {
    if !nvrtc_available() {
        return Err(GpuError::NoNvrtc);
    }
    compile_resolved(
        source,
        variant,
        arch,
        resolve_includes(source)?,
        nvrtc_options(variant),
    )
}

/// NVRTC's options for `variant`: its defines, C++17, line info.
fn nvrtc_options(variant: &Variant) -> Vec<String> {
    let mut options = variant.options();
    options.push("-std=c++17".into());
    options.push("-lineinfo".into());
    options
}

/// The NVRTC library's (major, minor) version; (0, 0) when it cannot say.
fn nvrtc_version() -> (i32, i32) {
    let (mut major, mut minor) = (0, 0);
    // SAFETY: nvrtcVersion writes two ints through valid pointers; callers checked that the
    // library loads.
    let ok = unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) };
    if ok == cudarc::nvrtc::sys::nvrtcResult::NVRTC_SUCCESS {
        (major, minor)
    } else {
        (0, 0)
    }
}

/// [`compile_ptx`] through the on-disk cache in `dir` ([`super::kcache`]; `None`: no cache):
/// the PTX of an earlier compile of the same source text, options, arch and NVRTC when the cache
/// holds it (and `true`), else compiled and stored (and `false`).
pub fn compile_ptx_cached(
    dir: Option<&std::path::Path>,
    source: &str,
    variant: &Variant,
    arch: &'static str,
) -> GpuResult<(Ptx, bool)> {
    cached_compile(dir, source, variant, arch, true)
}

/// [`compile_ptx_cached`]; `read` false compiles even when the cache holds an entry (and replaces
/// it: an entry the driver refused).
fn cached_compile(
    dir: Option<&std::path::Path>,
    source: &str,
    variant: &Variant,
    arch: &'static str,
    read: bool,
) -> GpuResult<(Ptx, bool)> {
    let Some(dir) = dir else {
        return Ok((compile_ptx(source, variant, arch)?, false));
    };
    if !nvrtc_available() {
        return Err(GpuError::NoNvrtc);
    }
    let text = resolve_includes(source)?;
    let options = nvrtc_options(variant);
    let (file, header) = kcache::entry(source, arch, nvrtc_version(), &options, &text);
    if let Some(ptx) = read.then(|| kcache::lookup(dir, &file, &header)).flatten() {
        return Ok((Ptx::from_src(ptx), true));
    }
    let ptx = compile_resolved(source, variant, arch, text, options)?;
    kcache::store(dir, &file, &header, &ptx.to_src());
    Ok((ptx, false))
}

/// NVRTC on `text` (`source` with its includes resolved) for `arch` with `options`.
fn compile_resolved(
    source: &str,
    variant: &Variant,
    arch: &'static str,
    text: String,
    options: Vec<String>,
) -> GpuResult<Ptx> {
    let opts = CompileOptions {
        arch: Some(arch),
        options: options.clone(),
        name: Some(source.to_string()),
        ..Default::default()
    };
    cudarc::nvrtc::compile_ptx_with_opts(text, opts).map_err(|e| {
        let log = match &e {
            CompileError::CompileError { log, .. } => log.to_string_lossy().into_owned(),
            other => format!("{other:?}"),
        };
        GpuError::Compile {
            source_name: source.to_string(),
            variant: variant.key(),
            arch: arch.to_string(),
            options,
            log,
        }
    })
}

type ModuleKey = (String, Variant, &'static str);

/// The cache key of (`source`, `variant`) on `arch`: the source's name, and the directory
/// [`SOURCE_DIR_ENV`] names when it is set, so that a process which sets or changes that variable
/// (e.g. a test comparing another directory's sources with the embedded ones bit for bit) runs
/// the kernels compiled from the sources it names, not ones an earlier call compiled.
fn module_key(source: &str, variant: &Variant, arch: &'static str) -> ModuleKey {
    module_key_in(source, variant, arch, std::env::var_os(SOURCE_DIR_ENV).as_deref())
}

fn module_key_in(
    source: &str,
    variant: &Variant,
    arch: &'static str,
    dir: Option<&std::ffi::OsStr>,
) -> ModuleKey {
    let name = match dir {
        Some(dir) => format!("{source}@{}", std::path::Path::new(dir).display()),
        None => source.to_string(),
    };
    (name, variant.clone(), arch)
}

/// One GPU: its context, architecture and the cache of compiled modules and functions.
/// Cheap to share (`Arc<Gpu>`); every method takes `&self`.
pub struct Gpu {
    ctx: Arc<CudaContext>,
    arch: &'static str,
    name: String,
    sm_count: i32,
    modules: Mutex<HashMap<ModuleKey, Arc<CudaModule>>>,
    /// Loaded functions and the dynamic shared memory limit each was given.
    functions: Mutex<HashMap<(ModuleKey, String), (CudaFunction, u32)>>,
}

impl std::fmt::Debug for Gpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Gpu({}, {}, {} SMs)", self.name, self.arch, self.sm_count)
    }
}

impl Gpu {
    /// Opens device `ordinal` (its primary context, the one libtorch uses too), checks that it is
    /// a Hopper GPU and that NVRTC is present.
    pub fn new(ordinal: usize) -> GpuResult<Arc<Gpu>> {
        if !driver_available() {
            return Err(GpuError::NoDriver);
        }
        let count = CudaContext::device_count().ctx("cuDeviceGetCount")?;
        if ordinal as i32 >= count {
            return Err(GpuError::NoGpu { ordinal, count });
        }
        let ctx = CudaContext::new(ordinal).ctx("cuDevicePrimaryCtxRetain")?;
        let name = ctx.name().ctx("cuDeviceGetName")?;
        let (major, minor) = ctx
            .compute_capability()
            .ctx("cuDeviceGetAttribute(compute capability)")?;
        if (major, minor) != (9, 0) {
            return Err(GpuError::Unsupported { name, major, minor });
        }
        if !nvrtc_available() {
            return Err(GpuError::NoNvrtc);
        }
        let sm_count = ctx
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .ctx("cuDeviceGetAttribute(multiprocessors)")?;
        Ok(Arc::new(Gpu {
            ctx,
            arch: arch_for(major, minor),
            name,
            sm_count,
            modules: Mutex::new(HashMap::new()),
            functions: Mutex::new(HashMap::new()),
        }))
    }

    /// The cudarc context (for allocating buffers and streams in tests and benchmarks).
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// NVRTC architecture the kernels are compiled for.
    pub fn arch(&self) -> &'static str {
        self.arch
    }

    /// Device name as the driver reports it.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Number of streaming multiprocessors.
    pub fn sm_count(&self) -> i32 {
        self.sm_count
    }

    /// The module of (`source`, `variant`) for this GPU's arch, compiled on first use (its PTX
    /// from the on-disk cache when an earlier process compiled it: [`super::kcache`]).
    pub fn module(&self, source: &str, variant: &Variant) -> GpuResult<Arc<CudaModule>> {
        let key = module_key(source, variant, self.arch);
        let mut modules = self.modules.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(m) = modules.get(&key) {
            return Ok(m.clone());
        }
        let t0 = std::time::Instant::now();
        let dir = kcache::cache_dir();
        let (ptx, cached) = compile_ptx_cached(dir.as_deref(), source, variant, self.arch)?;
        let m = match self.ctx.load_module(ptx) {
            // (a cached entry the driver refuses, e.g. a damaged file: compiled again, replaced)
            Err(_) if cached => {
                let (ptx, _) = cached_compile(dir.as_deref(), source, variant, self.arch, false)?;
                self.ctx.load_module(ptx)
            }
            loaded => loaded,
        }
        .ctx(&format!("cuModuleLoadData({source} [{}])", variant.key()))?;
        modules.insert(key, m.clone());
        {
            let mut b = BUILDS.lock().unwrap_or_else(|p| p.into_inner());
            b.0 += 1;
            b.1 += t0.elapsed().as_nanos() as u64;
        }
        Ok(m)
    }

    /// Kernel `name` of (`source`, `variant`), with its dynamic shared memory limit raised to
    /// `smem` bytes when that is above the 48 KB default.
    pub fn function(
        &self,
        source: &str,
        variant: &Variant,
        name: &str,
        smem: u32,
    ) -> GpuResult<CudaFunction> {
        let key = module_key(source, variant, self.arch);
        let fkey = (key, name.to_string());
        let raise = |f: &CudaFunction| {
            f.set_attribute(
                sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                smem as i32,
            )
            .ctx(&format!("cuFuncSetAttribute({name}, max dynamic smem {smem})"))
        };
        if let Some((f, limit)) = self
            .functions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_mut(&fkey)
        {
            // (a later launch may ask more than the first one did: session 50's sm_copy stages)
            if smem > (*limit).max(48 * 1024) {
                raise(f)?;
                *limit = smem;
            }
            return Ok(f.clone());
        }
        let m = self.module(source, variant)?;
        let f = m
            .load_function(name)
            .ctx(&format!("cuModuleGetFunction({name})"))?;
        if smem > 48 * 1024 {
            raise(&f)?;
        }
        self.functions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(fkey, (f.clone(), smem));
        Ok(f)
    }

    /// Makes this GPU's context current on the calling thread (before raw launches).
    pub fn bind(&self) -> GpuResult<()> {
        self.ctx.bind_to_thread().ctx("cuCtxSetCurrent")
    }
}

/// A CUDA stream given as the raw driver handle (e.g. libtorch's current stream). Null is the
/// legacy default stream.
#[derive(Debug, Clone, Copy)]
pub struct RawStream(pub sys::CUstream);

// SAFETY: a CUstream handle may be used from any thread of the process.
unsafe impl Send for RawStream {}
// SAFETY: as above; the driver serialises work on the stream.
unsafe impl Sync for RawStream {}

/// Launches kernel `f`, whose only parameter is the `#[repr(C)]` struct `params` (mirrored in
/// the `.cu` file), on `stream`.
///
/// # Safety
/// `params` must match the kernel's parameter struct exactly and every device pointer in it
/// must be valid for the accesses the kernel makes, until the stream has run it.
pub(crate) unsafe fn launch<P>(
    f: &CudaFunction,
    grid: (u32, u32, u32),
    block: u32,
    smem: u32,
    stream: RawStream,
    params: &P,
    what: &str,
) -> GpuResult<()> {
    // SAFETY: forwarded to the caller's contract.
    unsafe { launch_as(f, (grid, block, smem), stream, params, what, false, 1) }
}

/// [`launch`] with programmatic stream serialisation whatever [`pdl_on`] says: for a kernel that
/// must run *beside* the previous kernel of the stream (`bwd_dq_follow` beside the fused
/// backward: it may start once every CTA of that kernel has called `pdl_trigger`).
///
/// # Safety
/// As [`launch`]; the kernel must not read what the previous kernel writes before `pdl_wait()`
/// except through its own synchronisation with it (acquire loads of flags the previous kernel
/// releases), and must not wait on the previous kernel in a way that kernel waits on.
pub(crate) unsafe fn launch_dependent<P>(
    f: &CudaFunction,
    grid: (u32, u32, u32),
    block: u32,
    stream: RawStream,
    params: &P,
    what: &str,
) -> GpuResult<()> {
    // SAFETY: forwarded to the caller's contract.
    unsafe { launch_as(f, (grid, block, 0), stream, params, what, true, 1) }
}

/// Whether [`launch_chained`] asks for programmatic dependent launch: off unless `FLAMIA_PDL=1`
/// (the A/B knob; the kernels' `pdl_wait` makes either way correct). On by default from session
/// 20 (measured within noise then) to 32, whose same-call A/Bs (three device calls, two rounds
/// each) put the training call 2-3% faster without it at d = 128 on 32x2048, 64x1024 and
/// 256x256, within noise on the longer documents and at d = 64.
pub(crate) fn pdl_on() -> bool {
    super::env_on("FLAMIA_PDL")
}

/// [`launch`] with programmatic stream serialisation (PDL, [`pdl_on`]): the kernel may start
/// while the previous kernel of the stream still runs and overlap its set-up with that kernel's
/// tail. Only for kernels that call `pdl_wait()` (common.cuh) before their first global-memory
/// access: the chained launches of one training call (quantisers, forward, backward and its
/// helpers).
///
/// # Safety
/// As [`launch`], and `f` must call `pdl_wait()` before it touches global memory.
pub(crate) unsafe fn launch_chained<P>(
    f: &CudaFunction,
    grid: (u32, u32, u32),
    block: u32,
    smem: u32,
    stream: RawStream,
    params: &P,
    what: &str,
) -> GpuResult<()> {
    // SAFETY: forwarded to the caller's contract.
    unsafe { launch_as(f, (grid, block, smem), stream, params, what, pdl_on(), 1) }
}

/// [`launch_chained`] in thread-block clusters of `cluster` CTAs along x (`grid.0` a multiple of
/// it; `cuLaunchKernelEx` with the cluster-dimension attribute): the v4 backward's CTA pairs.
///
/// # Safety
/// As [`launch_chained`], and `f` must be written for clusters of that size.
pub(crate) unsafe fn launch_clustered<P>(
    f: &CudaFunction,
    geometry: ((u32, u32, u32), u32, u32),
    stream: RawStream,
    params: &P,
    what: &str,
    cluster: u32,
) -> GpuResult<()> {
    // SAFETY: forwarded to the caller's contract.
    unsafe { launch_as(f, geometry, stream, params, what, pdl_on(), cluster) }
}

/// How many clusters of `cluster` CTAs of `f` (`block` threads, `smem` bytes of dynamic shared
/// memory each) the device runs at once (`cuOccupancyMaxActiveClusters`): a cluster's CTAs share
/// a GPC, so on a GPC with an odd number of free SMs one SM stays out.
pub(crate) fn max_active_clusters(f: &CudaFunction, block: u32, smem: u32, cluster: u32) -> GpuResult<usize> {
    let mut attr = cluster_attr(cluster);
    let config = sys::CUlaunchConfig {
        gridDimX: cluster,
        gridDimY: 1,
        gridDimZ: 1,
        blockDimX: block,
        blockDimY: 1,
        blockDimZ: 1,
        sharedMemBytes: smem,
        hStream: std::ptr::null_mut(),
        attrs: &mut attr,
        numAttrs: 1,
    };
    let mut n: std::ffi::c_int = 0;
    // SAFETY: config and attr outlive the call; n is a plain out-parameter.
    unsafe { sys::cuOccupancyMaxActiveClusters(&mut n, f.cu_function(), &config) }
        .result()
        .ctx(&format!(
            "cuOccupancyMaxActiveClusters(cluster {cluster}, block {block}, smem {smem})"
        ))?;
    Ok(n.max(0) as usize)
}

/// The launch attribute of clusters of `cluster` CTAs along x.
fn cluster_attr(cluster: u32) -> sys::CUlaunchAttribute {
    // SAFETY: an all-zero attribute value is valid (plain integers); the id selects the member.
    let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
    attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
    attr.value.clusterDim.x = cluster;
    attr.value.clusterDim.y = 1;
    attr.value.clusterDim.z = 1;
    attr
}

/// [`launch`] (`chained` false, `cluster` 1: `cuLaunchKernel`) or `cuLaunchKernelEx` with the
/// programmatic-serialisation attribute ([`launch_chained`]) and / or clusters of `cluster` CTAs
/// ([`launch_clustered`]); `geometry` = (grid, block, dynamic shared memory).
///
/// # Safety
/// As [`launch_chained`] when `chained`, [`launch_clustered`] when `cluster` > 1, else as
/// [`launch`].
unsafe fn launch_as<P>(
    f: &CudaFunction,
    geometry: ((u32, u32, u32), u32, u32),
    stream: RawStream,
    params: &P,
    what: &str,
    chained: bool,
    cluster: u32,
) -> GpuResult<()> {
    let (grid, block, smem) = geometry;
    if grid.0 == 0 || grid.1 == 0 || grid.2 == 0 {
        return Ok(());
    }
    let mut args = [params as *const P as *mut c_void];
    if !chained && cluster <= 1 {
        // SAFETY: forwarded to the caller's contract.
        return unsafe {
            cudarc::driver::result::launch_kernel(
                f.cu_function(),
                grid,
                (block, 1, 1),
                smem,
                stream.0,
                &mut args,
            )
        }
        .ctx(&format!(
            "cuLaunchKernel({what}, grid {grid:?}, block {block}, smem {smem})"
        ));
    }
    let mut attrs = Vec::with_capacity(2);
    if chained {
        // SAFETY: an all-zero attribute value is valid (a plain integer union); the id selects the member.
        let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
        attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
        attr.value.programmaticStreamSerializationAllowed = 1;
        attrs.push(attr);
    }
    if cluster > 1 {
        attrs.push(cluster_attr(cluster));
    }
    let config = sys::CUlaunchConfig {
        gridDimX: grid.0,
        gridDimY: grid.1,
        gridDimZ: grid.2,
        blockDimX: block,
        blockDimY: 1,
        blockDimZ: 1,
        sharedMemBytes: smem,
        hStream: stream.0,
        attrs: attrs.as_mut_ptr(),
        numAttrs: attrs.len() as u32,
    };
    // SAFETY: config and attrs outlive the call; the parameter pointer as in `launch`.
    unsafe { sys::cuLaunchKernelEx(&config, f.cu_function(), args.as_mut_ptr(), std::ptr::null_mut()) }
        .result()
        .ctx(&format!(
            "cuLaunchKernelEx({what}, grid {grid:?}, block {block}, smem {smem}, programmatic serialisation {chained}, cluster {cluster})"
        ))
}

/// Reads registers and local memory (spill) bytes per thread of a loaded kernel.
pub fn resources(f: &CudaFunction) -> GpuResult<(i32, i32)> {
    Ok((
        f.num_regs().ctx("cuFuncGetAttribute(regs)")?,
        f.local_size_bytes().ctx("cuFuncGetAttribute(local)")?,
    ))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// NVRTC is there (scripts/env.sh puts the venv's on the library path and sets
    /// FLAMIA_REQUIRE_NVRTC): compile. Not there and not required: say so and skip.
    pub(crate) fn nvrtc_or_skip(test: &str) -> bool {
        if nvrtc_available() {
            return true;
        }
        assert!(
            std::env::var("FLAMIA_REQUIRE_NVRTC").as_deref() != Ok("1"),
            "{test}: FLAMIA_REQUIRE_NVRTC=1 but libnvrtc.so.13 cannot be loaded (LD_LIBRARY_PATH)"
        );
        eprintln!("{test}: SKIPPED, NVRTC not found (source scripts/env.sh to run it)");
        false
    }

    #[test]
    fn kernel_builds_since_an_earlier_reading_count_only_the_later_builds() {
        let a = KernelBuilds {
            modules: 3,
            seconds: 1.5,
        };
        let b = KernelBuilds {
            modules: 5,
            seconds: 4.0,
        };
        assert_eq!(
            b.since(&a),
            KernelBuilds {
                modules: 2,
                seconds: 2.5
            }
        );
        assert_eq!(b.since(&b), KernelBuilds::default());
        // (never negative, whatever order the readings come in)
        assert_eq!(a.since(&b), KernelBuilds::default());
        let now = kernel_builds();
        assert!(now.since(&KernelBuilds::default()) == now && now.seconds >= 0.0);
    }

    #[test]
    fn every_kernel_source_resolves_its_includes() {
        for (name, _) in SOURCES {
            let text = resolve_includes(name).unwrap();
            assert!(!text.contains("#include \""), "{name} still has a local include");
            assert!(text.starts_with(&format!("#line 1 \"{name}\"")));
        }
    }

    #[test]
    fn headers_are_inlined_once() {
        let text = resolve_includes("attn_fwd.cu").unwrap();
        assert_eq!(text.matches("#line 1 \"common.cuh\"").count(), 1);
        assert!(!text.contains("#pragma once"));
    }

    #[test]
    fn unknown_source_is_a_typed_error() {
        match resolve_includes("nope.cu") {
            Err(GpuError::UnknownSource { name, known, .. }) => {
                assert_eq!(name, "nope.cu");
                assert!(known.contains("attn_fwd.cu"));
            }
            other => panic!("expected UnknownSource, got {other:?}"),
        }
    }

    #[test]
    fn variant_keys_are_ordered_and_become_defines() {
        let a = Variant::new().define("B", 2).define("A", 1);
        let b = Variant::new().define("A", 1).define("B", 2);
        assert_eq!(a, b);
        assert_eq!(a.key(), "A=1,B=2");
        assert_eq!(a.options(), vec!["-DA=1".to_string(), "-DB=2".to_string()]);
    }

    #[test]
    fn a_source_directory_overrides_only_the_files_it_has() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("attn_fwd.cu"), "// replaced\n").unwrap();
        let d = Some(dir.path());
        assert_eq!(source_from("attn_fwd.cu", d).unwrap(), "// replaced\n");
        assert_eq!(
            source_from("attn_bwd.cu", d).unwrap(),
            embedded_text("attn_bwd.cu")
        );
        assert_eq!(
            source_from("attn_fwd.cu", None).unwrap(),
            embedded_text("attn_fwd.cu")
        );
        assert!(source_from("nope.cu", d).is_none(), "unknown names stay unknown");
    }

    #[test]
    fn modules_are_cached_per_source_directory() {
        let v = Variant::new().define("HEAD_DIM", 128);
        let key =
            |dir: Option<&str>| module_key_in("attn_bwd_v4.cu", &v, "sm_90a", dir.map(std::ffi::OsStr::new));
        assert_eq!(key(None), key(None));
        assert_eq!(key(Some("/tmp/a")), key(Some("/tmp/a")));
        assert_ne!(
            key(None),
            key(Some("/tmp/a")),
            "the embedded sources and a directory's"
        );
        assert_ne!(key(Some("/tmp/a")), key(Some("/tmp/b")), "two directories");
        let w = Variant::new().define("HEAD_DIM", 64);
        assert_ne!(key(None), module_key_in("attn_bwd_v4.cu", &w, "sm_90a", None));
    }

    fn embedded_text(name: &str) -> &'static str {
        SOURCES.iter().find(|(n, _)| *n == name).unwrap().1
    }

    #[test]
    fn hopper_gets_the_arch_specific_target() {
        assert_eq!(arch_for(9, 0), "sm_90a");
        assert_eq!(arch_for(7, 5), "sm_unsupported");
    }

    #[test]
    fn opening_a_gpu_never_panics() {
        // Without a driver (CI) this must be the typed NoDriver/NoGpu error; with one, a GPU.
        match Gpu::new(0) {
            Ok(g) => assert!(g.sm_count() > 0),
            Err(
                GpuError::NoDriver
                | GpuError::NoGpu { .. }
                | GpuError::NoNvrtc
                | GpuError::Unsupported { .. },
            ) => {}
            Err(e) => panic!("unexpected error kind: {e}"),
        }
    }

    #[test]
    fn every_source_compiles_for_sm_90a() {
        if !nvrtc_or_skip("every_source_compiles_for_sm_90a") {
            return;
        }
        for (name, _) in SOURCES.iter().filter(|(n, _)| n.ends_with(".cu")) {
            let ptx = compile_ptx(name, &Variant::new(), "sm_90a").unwrap_or_else(|e| panic!("{e}"));
            let src = ptx.to_src();
            assert!(src.contains(".target sm_90a"));
            // For ptxas / SASS inspection: FLAMIA_PTX_DIR=dir writes every module's PTX there.
            if let Ok(dir) = std::env::var("FLAMIA_PTX_DIR") {
                std::fs::write(std::path::Path::new(&dir).join(format!("{name}.ptx")), &src).unwrap();
            }
            if name.starts_with("attn_") {
                let v = Variant::new().define("NVFP4", 1);
                compile_ptx(name, &v, "sm_90a").unwrap_or_else(|e| panic!("{e}"));
            }
        }
    }

    #[test]
    fn the_disk_cache_serves_a_compiled_module_and_misses_on_another_variant() {
        if !nvrtc_or_skip("the_disk_cache_serves_a_compiled_module_and_misses_on_another_variant") {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let d = Some(dir.path());
        let v = Variant::new().define("MODE", 0);
        let t = std::time::Instant::now();
        let (first, hit) = compile_ptx_cached(d, "quant.cu", &v, "sm_90a").unwrap();
        let first = first.to_src();
        assert!(!hit);
        let compiled = t.elapsed();
        assert_eq!(first, compile_ptx("quant.cu", &v, "sm_90a").unwrap().to_src());
        let entries = || {
            let mut n: Vec<_> = std::fs::read_dir(dir.path())
                .unwrap()
                .map(|e| e.unwrap().path())
                .collect();
            n.sort();
            n
        };
        let files = entries();
        assert_eq!(files.len(), 1, "{files:?}");
        // the second compile reads the entry: a mark put into its PTX comes back
        let text = std::fs::read_to_string(&files[0]).unwrap();
        std::fs::write(&files[0], format!("{text}// marked\n")).unwrap();
        let t = std::time::Instant::now();
        let (second, hit) = compile_ptx_cached(d, "quant.cu", &v, "sm_90a").unwrap();
        let second = second.to_src();
        assert!(hit);
        eprintln!("quant.cu: NVRTC {compiled:?}, from the cache {:?}", t.elapsed());
        assert_eq!(second, format!("{first}// marked\n"));
        // another variant is another entry, compiled
        let w = Variant::new().define("MODE", 1);
        let (other, hit) = compile_ptx_cached(d, "quant.cu", &w, "sm_90a").unwrap();
        assert!(!hit && !other.to_src().contains("// marked"));
        assert_eq!(entries().len(), 2);
        // not reading (an entry the driver refused): compiled again and the entry replaced
        let (again, hit) = cached_compile(d, "quant.cu", &v, "sm_90a", false).unwrap();
        assert!(!hit);
        assert_eq!(again.to_src(), first);
        assert_eq!(
            compile_ptx_cached(d, "quant.cu", &v, "sm_90a")
                .unwrap()
                .0
                .to_src(),
            first
        );
        // no cache: NVRTC, nothing written
        let (none, hit) = compile_ptx_cached(None, "quant.cu", &v, "sm_90a").unwrap();
        assert!(!hit);
        assert_eq!(none.to_src(), first);
        assert_eq!(entries().len(), 2);
    }

    #[test]
    fn a_compile_error_carries_the_log() {
        if !nvrtc_or_skip("a_compile_error_carries_the_log") {
            return;
        }
        // An undefined identifier in a variant define reaches the kernel source.
        let v = Variant::new().define("FLAMIA_FORCE_ERROR", 1);
        match compile_ptx("quant.cu", &v, "sm_90a") {
            Err(GpuError::Compile { log, .. }) => assert!(log.contains("FLAMIA_FORCE_ERROR"), "{log}"),
            other => panic!("expected a compile error, got {:?}", other.map(|_| ())),
        }
    }
}
