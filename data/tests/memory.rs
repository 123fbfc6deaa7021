//! Bounded memory: streaming a shard holds one row group (plus the shuffle block and the prefetch
//! queue), not the shard. Own test binary so no other test shares the process's peak RSS.
//!
//! The peak is the kernel's high-water mark (`VmHWM`) after resetting it
//! (`/proc/self/clear_refs`); where that file is not writable (some containers) the test measures
//! another way, sampling the resident set (`VmRSS`) every millisecond from a second thread, and
//! says which measurement it used.

use flamia_data::bench::{peak_rss_mib, reset_peak_rss};
use flamia_data::{Config, Loader};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Current resident set in MiB (`VmRSS`).
fn rss_mib() -> f64 {
    let s = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status (Linux)");
    let line = s.lines().find(|l| l.starts_with("VmRSS:")).expect("VmRSS line");
    let kib: f64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kib / 1024.0
}

/// The largest `VmRSS` seen while `f` runs, sampled every millisecond by another thread.
fn sampled_peak_rss_mib(f: impl FnOnce()) -> f64 {
    let done = Arc::new(AtomicBool::new(false));
    let sampler = {
        let done = done.clone();
        std::thread::spawn(move || {
            let mut peak = rss_mib();
            while !done.load(Ordering::Relaxed) {
                peak = peak.max(rss_mib());
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            peak.max(rss_mib())
        })
    };
    f();
    done.store(true, Ordering::Relaxed);
    sampler.join().unwrap()
}

#[test]
fn streaming_a_large_shard_keeps_peak_rss_far_below_its_size() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("big.parquet");
    // 48 MiB of text in ~1 MiB row groups (128 documents of ~8 KiB).
    let (rows, bytes) = flamia_data::makeshard::make_synthetic(&p, 48, 128, 1).unwrap();
    assert!(bytes >= 48 << 20);
    let c = Config {
        train: vec![p.display().to_string()],
        val: vec![p.display().to_string()],
        seq_len: 2048,
        batch_rows: 8,
        shuffle_buffer: 64,
        num_threads: 2,
        ..Config::default()
    };
    let mut tokens = 0u64;
    let mut stream = || {
        for b in Loader::validation(&c, 0, 1).unwrap() {
            tokens += b.unwrap().tokens.len() as u64;
        }
    };
    let (before, peak, how) = if reset_peak_rss() {
        let before = peak_rss_mib().unwrap();
        stream();
        (before, peak_rss_mib().unwrap(), "VmHWM after clear_refs")
    } else {
        let before = rss_mib();
        let peak = sampled_peak_rss_mib(stream);
        (
            before,
            peak,
            "VmRSS sampled every 1 ms: clear_refs is not writable here",
        )
    };
    assert!(
        tokens >= bytes,
        "read {tokens} tokens of {bytes} bytes in {rows} documents"
    );
    let text_mib = bytes as f64 / (1 << 20) as f64;
    eprintln!("peak RSS {peak:.1} MiB (baseline {before:.1} MiB; {how}) streaming {text_mib:.0} MiB of text");
    assert!(
        peak - before < 32.0,
        "peak RSS grew by {:.1} MiB streaming {text_mib:.0} MiB",
        peak - before
    );
}
