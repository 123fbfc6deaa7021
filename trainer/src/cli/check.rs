//! `flamia check numerics`: accuracy of every FLAMIA path against exact attention and the
//! causal-leakage figures, on random normal inputs (`flamia_kernels::numerics`). Prints a table,
//! or one JSON object with `--json` (schema in `docs/numerics.md`).

use anyhow::{bail, Context};
use clap::{Args, Subcommand, ValueEnum};
use flamia_kernels::leakage::reference_attn;
use flamia_kernels::numerics::{run_check, CheckConfig, NumericsReport};
use flamia_kernels::AttnPath;

/// `flamia check ...`
#[derive(Debug, Args)]
pub struct CheckArgs {
    #[command(subcommand)]
    what: CheckCommand,
}

#[derive(Debug, Subcommand)]
enum CheckCommand {
    /// Cosine / relative L2 of O, dQ, dK, dV of each path against exact attention, dS zero
    /// fraction, and leakage figures, on random normal inputs.
    Numerics(NumericsArgs),
}

/// Where the quantised paths run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Device {
    /// The CPU reference.
    Cpu,
    /// The GPU kernels (Hopper), plus max |GPU - CPU reference| per output.
    Cuda,
}

#[derive(Debug, Args)]
struct NumericsArgs {
    /// Print one JSON object on stdout instead of a table.
    #[arg(long)]
    json: bool,
    /// Seed of the random normal inputs.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Document lengths, packed in this order.
    #[arg(long, value_delimiter = ',', default_value = "700,300,1024")]
    lens: Vec<usize>,
    /// Query heads.
    #[arg(long, default_value_t = 4)]
    heads: usize,
    /// KV heads (default: same as --heads); --heads must be a multiple of it.
    #[arg(long)]
    kv_heads: Option<usize>,
    /// Head dim: 64 or 128.
    #[arg(long, default_value_t = 128)]
    head_dim: usize,
    /// Only this path (mxfp8, nvfp4, leaky-fp8); default: all three.
    #[arg(long)]
    path: Option<String>,
    /// Where the quantised paths run.
    #[arg(long, value_enum, default_value_t = Device::Cpu)]
    device: Device,
    /// Skip the leakage figures (they cost 17 extra forward+backward runs).
    #[arg(long)]
    no_leakage: bool,
}

/// Runs `flamia check ...`.
pub fn run(args: CheckArgs) -> anyhow::Result<()> {
    match args.what {
        CheckCommand::Numerics(a) => numerics(a),
    }
}

fn numerics(a: NumericsArgs) -> anyhow::Result<()> {
    let paths = match &a.path {
        None => CheckConfig::default().paths,
        Some(p) => {
            let path: AttnPath = p.parse().with_context(|| format!("--path {p}"))?;
            if path == AttnPath::Exact {
                bail!("--path exact: the check compares mxfp8, nvfp4 or leaky-fp8 with exact attention");
            }
            vec![path]
        }
    };
    let cfg = CheckConfig {
        seed: a.seed,
        lens: a.lens.clone(),
        heads: a.heads,
        kv_heads: a.kv_heads.unwrap_or(a.heads),
        head_dim: a.head_dim,
        paths,
        leakage: !a.no_leakage,
    };
    let (report, gpu_vs_cpu) = match a.device {
        Device::Cpu => (
            run_check(&cfg, &reference_attn, "cpu").context("numerics check on the CPU reference")?,
            None,
        ),
        Device::Cuda => {
            let (r, d) = super::check_cuda::run(&cfg)?;
            (r, Some(d))
        }
    };
    if a.json {
        let mut v = serde_json::to_value(&report)?;
        if let (Some(d), Some(m)) = (&gpu_vs_cpu, v.as_object_mut()) {
            m.insert("gpu_vs_cpu".into(), serde_json::to_value(d)?);
        }
        println!("{v}");
    } else {
        print_table(&report);
        if let Some(d) = &gpu_vs_cpu {
            super::check_cuda::print_diffs(d);
        }
    }
    Ok(())
}

fn print_table(r: &NumericsReport) {
    let c = &r.config;
    println!(
        "FLAMIA numerics on {}: lens {:?}, heads {}/{} (q/kv), head_dim {}, seed {}, causal, random normal inputs",
        r.device, c.lens, c.heads, c.kv_heads, c.head_dim, c.seed
    );
    println!();
    println!(
        "{:<10} {:>9} {:>9} {:>9} {:>9}   {:>8} {:>8} {:>8} {:>8}   {:>9} {:>7}",
        "path",
        "cos O",
        "cos dQ",
        "cos dK",
        "cos dV",
        "relL2 O",
        "relL2 dQ",
        "relL2 dK",
        "relL2 dV",
        "dS->0",
        "time s"
    );
    let mut uncounted = false;
    for (name, p) in &r.paths {
        // The GPU kernels do not count dS underflows: NaN there (null in --json).
        let ds0 = if p.ds_zero_fraction.is_nan() {
            uncounted = true;
            "n/a".to_string()
        } else {
            format!("{:.4}%", 100.0 * p.ds_zero_fraction)
        };
        println!(
            "{:<10} {:>9.6} {:>9.6} {:>9.6} {:>9.6}   {:>8.5} {:>8.5} {:>8.5} {:>8.5}   {:>9} {:>7.2}",
            name,
            p.cosine.o,
            p.cosine.dq,
            p.cosine.dk,
            p.cosine.dv,
            p.rel_l2.o,
            p.rel_l2.dq,
            p.rel_l2.dk,
            p.rel_l2.dv,
            ds0,
            p.wall_s
        );
    }
    if uncounted {
        println!("(dS->0 n/a: the GPU kernels do not count dS elements rounded to zero)");
    }
    if let Some(l) = &r.leakage {
        println!();
        println!(
            "leakage (Q, K, V, dO after t = {} x 1e3; max relative change of O, LSE, dQ up to t, and of dK, dV with dO after t zero):",
            l.t
        );
        let bit = |b: bool| if b { "bitwise zero" } else { "changed" };
        println!(
            "  mxfp8 before own block (< {}): {:.3e} ({})",
            l.mxfp8.detail.block_start,
            l.mxfp8.before_own_block,
            bit(l.mxfp8.before_own_block_bitwise_zero)
        );
        println!("  mxfp8 in own block:            {:.3e}", l.mxfp8.in_own_block);
        println!(
            "  mxfp8 + precision options:     {:.3e} ({})",
            l.mxfp8_precision.max,
            bit(l.mxfp8_precision.bitwise_zero)
        );
        println!("  leaky-fp8 (must leak):         {:.3e}", l.leaky_fp8.max);
        match &l.doc_isolation {
            Some(d) => println!(
                "  doc isolation (one doc x 1e4): {:.3e} ({})",
                d.max,
                bit(d.bitwise_zero)
            ),
            None => println!("  doc isolation: needs 2 or more documents"),
        }
    }
    println!();
    println!("wall time: {:.2} s", r.wall_s);
}
