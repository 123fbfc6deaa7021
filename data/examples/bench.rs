//! `flamia data bench` without building the trainer (no libtorch), for measuring the pipeline
//! with an optimised build: `cargo run --profile test -p flamia-data --example bench -- \
//!   [--train SPEC] [--tokenizer bytes|FILE] [--seq-len N] [--batch-rows N] [--batches N]
//!   [--threads N[,N..]] [--step-ms MS] [--tokenize-docs N] [--shuffle-row-groups N]`.

use std::time::Duration;

use flamia_data::{bench, Config};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut cfg = Config {
        seq_len: 2048,
        ..Config::default()
    };
    let (mut batches, mut step_ms, mut tok_docs) = (200u64, 0.0f64, 4096usize);
    let mut threads = vec![0usize];
    let args: Vec<String> = std::env::args().skip(1).collect();
    for pair in args.chunks(2) {
        let [k, v] = pair else {
            return Err(format!("flag {pair:?} needs a value").into());
        };
        match k.as_str() {
            "--train" => cfg.train = vec![v.clone()],
            "--tokenizer" => cfg.tokenizer = v.clone(),
            "--seq-len" => cfg.seq_len = v.parse()?,
            "--batch-rows" => cfg.batch_rows = v.parse()?,
            "--batches" => batches = v.parse()?,
            "--threads" => threads = v.split(',').map(str::parse).collect::<Result<_, _>>()?,
            "--step-ms" => step_ms = v.parse()?,
            "--tokenize-docs" => tok_docs = v.parse()?,
            "--shuffle-row-groups" => cfg.shuffle_row_groups = v.parse()?,
            _ => return Err(format!("unknown flag {k}").into()),
        }
    }
    cfg.validate()?;
    for &t in &threads {
        cfg.num_threads = t;
        let p = bench::pipeline(&cfg, batches, Duration::from_secs_f64(step_ms / 1e3))?;
        println!(
            "pipeline: {t:3} threads: {} batches of {}x{}: {:.0} tokens/s after the first batch ({:.2} s to it); \
             waited {:.3} s of {:.3} s (step {step_ms} ms); shuffle_row_groups {}; peak RSS {:.1} MiB",
            p.batches,
            cfg.batch_rows,
            cfg.seq_len,
            p.tokens_per_s(),
            p.first_batch_seconds,
            p.wait_seconds,
            p.seconds - p.first_batch_seconds,
            cfg.shuffle_row_groups,
            p.peak_rss_mib.unwrap_or(0.0)
        );
        if tok_docs > 0 {
            let (n, s) = bench::tokenize_throughput(&cfg, t, tok_docs)?;
            println!(
                "tokenise: {t:3} threads: {n} tokens in {s:.3} s = {:.0} tokens/s (in memory)",
                n as f64 / s
            );
        }
    }
    Ok(())
}
