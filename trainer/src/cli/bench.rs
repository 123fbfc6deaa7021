//! `flamia bench attention`: times the FLAMIA GPU kernels on the nine packed workloads of
//! `bench/anchors.py` (16 heads, causal, 65,536 tokens per row; d = 128, or 64 with `--head-dim 64`) and prints, per
//! workload, CUDA-event medians of the quantisers, forward, backward and the whole training call
//! with TFLOP/s, the kernels' registers/spills and the SM clock (nvidia-smi) before and after.
//! `bench/run_bench.sh` runs it and the BF16 anchors in one device call.

use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use flamia_kernels::gpu::bench::{device_copy_gbs, run_workload, workload, workloads, BenchRow, COPY_BYTES};
use flamia_kernels::gpu::{Attention, Gpu};
use flamia_kernels::{AttnOptions, AttnPath};
use std::path::PathBuf;

#[derive(Debug, Args)]
pub struct BenchArgs {
    #[command(subcommand)]
    what: BenchWhat,
}

#[derive(Debug, Subcommand)]
enum BenchWhat {
    /// FLAMIA attention kernels on the anchors' packed workloads (needs a Hopper GPU).
    Attention(AttentionArgs),
}

#[derive(Debug, Args)]
struct AttentionArgs {
    /// Attention path: mxfp8, nvfp4 (FP4 numerics emulated through BF16 wgmma) or leaky-fp8.
    #[arg(long, default_value = "mxfp8")]
    path: String,
    /// Write the rows as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Only these workloads (names as in anchors.py, or NxL: N documents of L tokens, e.g.
    /// 1x131072; repeatable). Default: all nine.
    #[arg(long)]
    workload: Vec<String>,
    /// Turn on the three causal-safety precision options.
    #[arg(long, conflicts_with = "precision")]
    causally_safe: bool,
    /// Turn on precision options one by one (comma-separated or repeated), to see what each
    /// costs: per-token-scales, row-ds-exponents, causal-dq-scaling, no-hadamard.
    #[arg(long, value_delimiter = ',')]
    precision: Vec<String>,
    /// Key/value heads against the 16 query heads (16, 8, 4, 2 or 1; fewer is GQA, e.g. 8 for
    /// the 1B preset's 16:8).
    #[arg(long, default_value_t = 16)]
    kv_heads: usize,
    /// Head dim (128, or 64 as in Llama-3.2-1B; the v4 kernels take both).
    #[arg(long, default_value_t = flamia_kernels::gpu::bench::HEAD_DIM)]
    head_dim: usize,
}

/// SM clock and power as nvidia-smi reports them (or why not).
fn sm_clock() -> String {
    match std::process::Command::new("nvidia-smi")
        .args([
            "--query-gpu=clocks.sm,power.draw,temperature.gpu",
            "--format=csv,noheader",
        ])
        .output()
    {
        Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout).trim().to_string(),
        Ok(o) => format!("nvidia-smi failed: {}", String::from_utf8_lossy(&o.stderr).trim()),
        Err(e) => format!("nvidia-smi not available: {e}"),
    }
}

/// The precision options named in `--precision`, switched on (`no-hadamard` switches the
/// rotation off) in `p`.
fn apply_precision(p: &mut flamia_kernels::Precision, names: &[String]) -> anyhow::Result<()> {
    for n in names {
        match n.trim() {
            "per-token-scales" => p.per_token_scales = true,
            "row-ds-exponents" => p.row_ds_exponents = true,
            "causal-dq-scaling" => p.causal_dq_scaling = true,
            "no-hadamard" => p.hadamard = false,
            other => bail!(
                "--precision {other:?}: allowed are per-token-scales, row-ds-exponents, \
                 causal-dq-scaling, no-hadamard (comma-separated or repeated)"
            ),
        }
    }
    Ok(())
}

pub fn run(a: BenchArgs) -> anyhow::Result<()> {
    let BenchWhat::Attention(a) = a.what;
    let path: AttnPath = a.path.parse().context("--path")?;
    let mut opts = AttnOptions::new(path);
    if a.causally_safe {
        opts.precision = flamia_kernels::Precision::causally_safe(opts.precision.hadamard);
    }
    apply_precision(&mut opts.precision, &a.precision)?;
    if a.kv_heads == 0 || !flamia_kernels::gpu::bench::HEADS.is_multiple_of(a.kv_heads) {
        bail!(
            "--kv-heads {}: must divide the {} query heads (16, 8, 4, 2 or 1)",
            a.kv_heads,
            flamia_kernels::gpu::bench::HEADS
        );
    }
    if !flamia_kernels::gpu::GPU_HEAD_DIMS.contains(&a.head_dim) {
        bail!(
            "--head-dim {}: the GPU kernels are built for {:?}",
            a.head_dim,
            flamia_kernels::gpu::GPU_HEAD_DIMS
        );
    }
    let gpu = Gpu::new(0).context("opening the GPU for the attention benchmark")?;
    let all = workloads();
    let chosen: Vec<(String, Vec<usize>)> = if a.workload.is_empty() {
        all.iter().map(|(n, l)| (n.to_string(), l.clone())).collect()
    } else {
        let mut v = Vec::new();
        for w in &a.workload {
            let Some(lens) = workload(w) else {
                bail!(
                    "unknown workload {w:?}; allowed: {}, or NxL (N documents of L tokens, N*L <= 4194304)",
                    all.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", ")
                );
            };
            v.push((w.clone(), lens));
        }
        v
    };
    println!(
        "flamia bench attention: 16 query heads, {} KV heads, d={}, causal on {} ({}, {} SMs), path {path}, precision {:?}",
        a.kv_heads,
        a.head_dim,
        gpu.name(),
        gpu.arch(),
        gpu.sm_count(),
        opts.precision
    );
    let clock_before = sm_clock();
    println!("SM clock before: {clock_before}  (clocks.sm, power.draw, temperature)");
    let copy_before = device_copy_gbs(&gpu, COPY_BYTES).context("timing the device copy")?;
    println!(
        "device copy before: {copy_before:.0} GB/s  (read + written; cuMemcpyDtoD of {} MiB, median of 20: the quantiser's reference)",
        COPY_BYTES >> 20
    );
    let mut rows: Vec<BenchRow> = Vec::new();
    println!(
        "{:<14} {:>5} | {:>9} {:>6} {:>9} {:>9} {:>9} | {:>8} {:>8} {:>8} | {:>8} {:>8} {:>8} | {:>8} {:>5}  (ms medians, quantiser GB/s read + written; TFLOP/s; bwd parts alone, ms: v4 = the fused backward's launches in `dq`, its dQ conversion alone in `dkdv`; MiB the call allocates; MHz: the SM clock measured on the GPU right after the training call's loop)",
        "workload", "docs", "quant", "GB/s", "fwd", "bwd", "train", "fwd", "bwd", "train", "dO quant", "dq", "dkdv", "MiB", "MHz"
    );
    for (name, lens) in &chosen {
        let r = run_workload(&gpu, opts, name, lens, a.kv_heads, a.head_dim)
            .with_context(|| format!("workload {name}"))?;
        println!(
            "{:<14} {:>5} | {:>9.3} {:>6.0} {:>9.3} {:>9.3} {:>9.3} | {:>8.1} {:>8.1} {:>8.1} | {:>8.3} {:>8.3} {:>8.3} | {:>8.0} {:>5.0}",
            r.workload,
            r.docs,
            r.quant_ms,
            r.quant_gbs,
            r.fwd_ms,
            r.bwd_ms,
            r.train_ms,
            r.fwd_tflops,
            r.bwd_tflops,
            r.train_tflops,
            r.dograd_ms,
            r.dq_ms,
            r.dkdv_ms,
            r.call_mib,
            r.train_mhz
        );
        rows.push(r);
    }
    let clock_after = sm_clock();
    println!("SM clock after:  {clock_after}");
    let copy_after = device_copy_gbs(&gpu, COPY_BYTES).context("timing the device copy")?;
    println!("device copy after:  {copy_after:.0} GB/s");
    let (lo, hi) = rows.iter().fold((f64::INFINITY, 0f64), |(lo, hi), r| {
        (lo.min(r.quant_gbs), hi.max(r.quant_gbs))
    });
    if !rows.is_empty() {
        let copy = copy_before.max(copy_after);
        println!(
            "quantiser: {lo:.0}-{hi:.0} GB/s = {:.1}-{:.1}% of the faster device copy of this call ({copy:.0} GB/s)",
            100.0 * lo / copy,
            100.0 * hi / copy
        );
    }
    let res = Attention::new(gpu.clone(), opts)?.kernel_resources(a.head_dim)?;
    for (name, regs, local) in &res {
        println!("kernel {name:<14} registers/thread {regs:>3}  local (spill) bytes {local}");
    }
    if let Some(p) = a.json {
        let doc = serde_json::json!({
            "device": gpu.name(), "arch": gpu.arch(), "path": path.name(),
            "precision": format!("{:?}", opts.precision),
            "sm_clock_before": clock_before, "sm_clock_after": clock_after,
            "copy_gbs_before": copy_before, "copy_gbs_after": copy_after,
            "kernels": res.iter().map(|(n, r, l)| serde_json::json!({"kernel": n, "regs": r, "local_bytes": l})).collect::<Vec<_>>(),
            "rows": rows,
        });
        std::fs::write(&p, serde_json::to_string_pretty(&doc)?)
            .with_context(|| format!("writing {}", p.display()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::apply_precision;

    #[test]
    fn precision_names_switch_their_option_and_unknown_ones_are_refused() {
        let mut p = flamia_kernels::Precision::default();
        apply_precision(&mut p, &["row-ds-exponents".into(), " no-hadamard".into()]).unwrap();
        assert!(p.row_ds_exponents && !p.hadamard);
        assert!(!p.per_token_scales && !p.causal_dq_scaling);
        apply_precision(&mut p, &["per-token-scales".into(), "causal-dq-scaling".into()]).unwrap();
        assert!(p.per_token_scales && p.causal_dq_scaling);
        let e = apply_precision(&mut p, &["per-token".into()])
            .unwrap_err()
            .to_string();
        assert!(e.contains("per-token-scales, row-ds-exponents"), "{e}");
    }
}
