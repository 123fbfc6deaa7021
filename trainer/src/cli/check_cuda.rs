//! The `--device cuda` side of `flamia check numerics`: the same report as on the CPU, computed
//! by the GPU kernels (`flamia_kernels::gpu::host`), plus the maximum absolute difference between
//! the GPU and the CPU reference per output (O, LSE, dQ, dK, dV) for each path, on the same
//! BF16-representable inputs.
//!
//! The GPU takes BF16 inputs, so its cosines are compared with the CPU reference run on the same
//! BF16-rounded inputs (`cpu_bf16_cosine`); both are scored against `exact` on the f32 inputs.

use anyhow::Context;
use flamia_kernels::gpu::{host, Gpu};
use flamia_kernels::leakage::reference_attn;
use flamia_kernels::numerics::{check_call, run_check, CheckConfig, NumericsReport, PerTensor};
use flamia_kernels::{AttnCall, AttnOptions};
use serde::Serialize;

/// Max |GPU - CPU reference| per output of one path.
#[derive(Debug, Clone, Serialize)]
pub struct GpuVsCpu {
    pub path: String,
    pub o: f64,
    pub lse: f64,
    pub dq: f64,
    pub dk: f64,
    pub dv: f64,
    /// Cosines to `exact` of the CPU reference fed the GPU's BF16-rounded inputs.
    pub cpu_bf16_cosine: PerTensor,
    /// GPU cosine minus `cpu_bf16_cosine` per output (>= 0: the GPU is no worse).
    pub gpu_minus_cpu_cosine: PerTensor,
}

fn max_abs(a: &[f32], b: &[f32]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (*x as f64 - *y as f64).abs())
        .fold(0.0, f64::max)
}

/// Runs the numerics check on the GPU and the GPU-versus-CPU comparison.
pub fn run(cfg: &CheckConfig) -> anyhow::Result<(NumericsReport, Vec<GpuVsCpu>)> {
    let gpu = Gpu::new(0).context("opening the GPU for `check numerics --device cuda`")?;
    let attn = host::attn_fn(&gpu);
    let device = format!("cuda ({}, {})", gpu.name(), gpu.arch());
    let report = run_check(cfg, &attn, &device).context("numerics check on the GPU")?;
    let cpu_bf16 = |call: &AttnCall| reference_attn(&call.bf16_rounded());
    let cpu_cfg = CheckConfig {
        leakage: false,
        ..cfg.clone()
    };
    let cpu_report = run_check(&cpu_cfg, &cpu_bf16, "cpu (BF16-rounded inputs)")
        .context("CPU reference on the GPU's BF16 inputs")?;
    let call = check_call(cfg)?.bf16_rounded();
    let mut diffs = Vec::new();
    for &path in &cfg.paths {
        let one = call.with_opts(AttnOptions::new(path));
        let g = attn(&one)?;
        let c = reference_attn(&one)?;
        let (gc, cc) = (
            &report.paths[path.name()].cosine,
            &cpu_report.paths[path.name()].cosine,
        );
        diffs.push(GpuVsCpu {
            path: path.name().to_string(),
            o: max_abs(&g.0.o, &c.0.o),
            lse: max_abs(&g.0.lse, &c.0.lse),
            dq: max_abs(&g.1.dq, &c.1.dq),
            dk: max_abs(&g.1.dk, &c.1.dk),
            dv: max_abs(&g.1.dv, &c.1.dv),
            cpu_bf16_cosine: *cc,
            gpu_minus_cpu_cosine: PerTensor {
                o: gc.o - cc.o,
                dq: gc.dq - cc.dq,
                dk: gc.dk - cc.dk,
                dv: gc.dv - cc.dv,
            },
        });
    }
    Ok((report, diffs))
}

/// Prints the GPU-versus-CPU table.
pub fn print_diffs(diffs: &[GpuVsCpu]) {
    println!();
    println!("max |GPU - CPU reference| (same BF16 inputs):");
    println!(
        "{:<10} {:>10} {:>10} {:>10} {:>10} {:>10}",
        "path", "O", "LSE", "dQ", "dK", "dV"
    );
    for d in diffs {
        println!(
            "{:<10} {:>10.3e} {:>10.3e} {:>10.3e} {:>10.3e} {:>10.3e}",
            d.path, d.o, d.lse, d.dq, d.dk, d.dv
        );
    }
    println!();
    println!("cosine to exact: GPU minus CPU reference on the same BF16 inputs (>= 0: GPU no worse):");
    println!(
        "{:<10} {:>10} {:>10} {:>10} {:>10}",
        "path", "O", "dQ", "dK", "dV"
    );
    for d in diffs {
        let g = &d.gpu_minus_cpu_cosine;
        println!(
            "{:<10} {:>+10.2e} {:>+10.2e} {:>+10.2e} {:>+10.2e}",
            d.path, g.o, g.dq, g.dk, g.dv
        );
    }
}
