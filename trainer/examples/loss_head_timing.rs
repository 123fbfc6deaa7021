//! Times one forward + backward of the chunked output head and cross-entropy
//! (`model::loss::head_forward_backward`) on the CPU with libtorch's default threads (`OMP_NUM_THREADS` sets them):
//! `tokens x dim` hidden states, a `vocab x dim` f32 output weight, one chunk, f32 compute,
//! 1 of 16 targets ignored. CPU only: the GPU figure is a different balance of GEMM and memory.
//!
//! `cargo run -p flamia-trainer --example loss_head_timing -- [tokens dim vocab runs]`
//! (default 2048 2048 32768 5) prints the median and the fastest of `runs` timed calls after
//! one warm-up call.

use std::time::Instant;

use flamia_trainer::model::loss::{head_forward_backward, IGNORE};
use tch::{Device, Kind, Tensor};

fn main() -> anyhow::Result<()> {
    let args: Vec<i64> = std::env::args()
        .skip(1)
        .map(|a| a.parse())
        .collect::<Result<_, _>>()?;
    let arg = |i: usize, d: i64| args.get(i).copied().unwrap_or(d);
    let (t, d, v, runs) = (arg(0, 2048), arg(1, 2048), arg(2, 32768), arg(3, 5).max(1));
    tch::manual_seed(0);
    let opts = (Kind::Float, Device::Cpu);
    let h = Tensor::f_randn([t, d], opts)?;
    let w = Tensor::f_randn([v, d], opts)?.f_mul_scalar(0.02)?;
    let mut targets = Tensor::f_randint(v, [t], (Kind::Int64, Device::Cpu))?;
    let ignored = Tensor::f_arange_start_step(0, t, 16, (Kind::Int64, Device::Cpu))?;
    let _ = targets.f_index_fill_(0, &ignored, IGNORE)?;
    let denom = (t - (t + 15) / 16) as f64;
    let call = || -> anyhow::Result<f64> {
        let start = Instant::now();
        let g = head_forward_backward(&h, &w, &targets, denom, t as usize)?;
        let _ = g.loss_sum.f_double_value(&[])?;
        Ok(start.elapsed().as_secs_f64() * 1e3)
    };
    call()?;
    let mut ms: Vec<f64> = (0..runs).map(|_| call()).collect::<Result<_, _>>()?;
    ms.sort_by(f64::total_cmp);
    println!(
        "head_forward_backward (CPU, f32, {} threads) tokens {t} dim {d} vocab {v}: median {:.1} ms, fastest {:.1} ms over {runs} calls",
        tch::get_num_threads(),
        ms[ms.len() / 2],
        ms[0]
    );
    Ok(())
}
