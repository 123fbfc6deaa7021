//! Times `AdamW::step` over one f32 parameter of 2^26 elements on the CPU with one libtorch
//! thread (weight decay on): the cost of the update alone, for docs/perf.md.
//!
//! `cargo run -p flamia-trainer --example adamw_step_timing [updates]` prints the median and
//! the fastest of `updates` (default 20) timed updates after one warm-up update.

use std::time::Instant;

use flamia_trainer::config::TrainingConfig;
use flamia_trainer::optim::AdamW;
use tch::{Device, Kind, Tensor};

fn main() -> anyhow::Result<()> {
    let updates: usize = std::env::args()
        .nth(1)
        .map(|a| a.parse())
        .transpose()?
        .unwrap_or(20);
    tch::set_num_threads(1);
    tch::manual_seed(0);
    let n = 1i64 << 26;
    let opts = (Kind::Float, Device::Cpu);
    let p = Tensor::f_randn([n], opts)?.set_requires_grad(true);
    let cfg = TrainingConfig {
        weight_decay: 0.1,
        ..Default::default()
    };
    let mut opt = AdamW::new(vec![("w.weight".into(), p)], &cfg, |_| false)?;
    let g = Tensor::f_randn([n], opts)?.f_mul_scalar(1e-2)?;
    tch::no_grad(|| opt.flat_grads().shallow_clone().f_copy_(&g))?;
    opt.step(1e-3)?;
    let mut ms: Vec<f64> = (0..updates)
        .map(|_| {
            let start = Instant::now();
            opt.step(1e-3).map(|()| start.elapsed().as_secs_f64() * 1e3)
        })
        .collect::<Result<_, _>>()?;
    ms.sort_by(f64::total_cmp);
    let median = ms[ms.len() / 2];
    // 28 bytes per parameter is the least an update can move (read p, g, m, v; write p, m, v).
    let gbs = 28.0 * n as f64 / (median * 1e-3) / 1e9;
    println!(
        "AdamW::step, {n} f32 parameters, 1 thread: median {median:.1} ms, fastest {:.1} ms over {updates} updates ({gbs:.1} GB/s at 28 B/parameter)",
        ms[0]
    );
    Ok(())
}
