//! Peak memory for the metrics: GPU memory in use at its highest (driver view: what the caching
//! allocator holds, like torchtitan's `memory/max_reserved`), or the process's peak RSS on CPU.

use tch::Device;

/// Current peak in GiB for `device` (0 when unknown).
pub fn peak_gib(device: Device, peak_so_far: &mut f64) -> f64 {
    let now = match device {
        Device::Cuda(_) => cuda_used_bytes().unwrap_or(0) as f64,
        _ => cpu_peak_rss_bytes().unwrap_or(0) as f64,
    } / (1u64 << 30) as f64;
    *peak_so_far = peak_so_far.max(now);
    *peak_so_far
}

fn cpu_peak_rss_bytes() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

fn cuda_used_bytes() -> Option<u64> {
    // libtorch has made its primary context current on this thread by now.
    let (free, total) = cudarc::driver::result::mem_get_info().ok()?;
    Some((total - free) as u64)
}
