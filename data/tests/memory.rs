//! Bounded memory: streaming a shard holds one row group (plus the shuffle block and the prefetch
//! queue), not the shard. Own test binary so no other test shares the process's peak RSS.

use flamia_data::bench::{peak_rss_mib, reset_peak_rss};
use flamia_data::{Config, Loader};

#[test]
fn streaming_a_large_shard_keeps_peak_rss_far_below_its_size() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("big.parquet");
    // 48 MiB of text in ~1 MiB row groups (128 documents of ~8 KiB).
    let (rows, bytes) = flamia_data::makeshard::make_synthetic(&p, 48, 128, 1).unwrap();
    assert!(bytes >= 48 << 20);
    if !reset_peak_rss() {
        eprintln!("cannot reset the peak-RSS mark on this system; skipping the measurement");
        return;
    }
    let before = peak_rss_mib().unwrap();
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
    for b in Loader::validation(&c, 0, 1).unwrap() {
        tokens += b.unwrap().tokens.len() as u64;
    }
    assert!(
        tokens >= bytes,
        "read {tokens} tokens of {bytes} bytes in {rows} documents"
    );
    let peak = peak_rss_mib().unwrap();
    let text_mib = bytes as f64 / (1 << 20) as f64;
    eprintln!("peak RSS {peak:.1} MiB (baseline {before:.1} MiB) streaming {text_mib:.0} MiB of text");
    assert!(
        peak - before < 32.0,
        "peak RSS grew by {:.1} MiB streaming {text_mib:.0} MiB",
        peak - before
    );
}
