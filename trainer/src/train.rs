//! The training loop: data -> packed forward through the bridge -> loss -> backward (gradient
//! accumulation) -> non-finite/spike check -> clip -> AdamW -> metrics -> checkpoints.
//!
//! Batches are packed: every row of a micro-batch is one stretch of `(rows * seq_len)` tokens
//! with its documents' boundaries (`Batch::packed_cu_seqlens`), so attention never crosses a
//! document or a row.
//!
//! Data parallelism (`docs/distributed.md`) is opt-in through the launcher's environment: with
//! `RANK`/`WORLD_SIZE` (torchrun, `launch/local.sh`) or Slurm variables the run joins a process
//! group ([`Ddp`]), each rank reads its share of the data, gradients are averaged before the
//! gradient norm, the loss is averaged before the skip/spike decision, and only rank 0 writes
//! logs, W&B, checkpoints and `summary.json`. Without those variables every `Ddp` call is a no-op
//! and the run is exactly the plain single-process one.

use std::path::PathBuf;
use std::time::Instant;

use flamia_data::{Batch, Loader};
use serde::Serialize;
use tch::{Device, Tensor};

use crate::attention::callback_seconds;
use crate::checkpoint::{self, TrainState};
use crate::config::TrainConfig;
use crate::ddp::{Ddp, DdpOptions};
use crate::device::{compute_kind, parse_device};
use crate::error::{Result, TrainError};
use crate::metrics::jsonl::JsonlWriter;
use crate::metrics::progress::Progress;
use crate::metrics::wandb::Wandb;
use crate::metrics::{StepMetrics, PEAK_BF16_FLOPS};
use crate::model::{loss_sum, Llama};
use crate::optim::{lr_at, AdamW};

/// How to run: resume or not, and where to stop early.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// Continue from the newest checkpoint in the run directory (fresh start if there is none).
    pub resume: bool,
    /// Stop (with a checkpoint) after this many optimizer steps of this invocation.
    pub stop_after: Option<usize>,
}

/// What a finished (or stopped) run reports; also written to `<run>/summary.json`.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    pub run_dir: PathBuf,
    pub attention_path: String,
    pub device: String,
    pub params: usize,
    pub steps: usize,
    pub skipped_steps: usize,
    pub first_loss: f64,
    pub final_loss: f64,
    /// Mean loss over the last 10% of this invocation's steps (at least one).
    pub tail_mean_loss: f64,
    pub losses: Vec<f64>,
    pub tokens: u64,
    pub wall_s: f64,
    pub mean_tps: f64,
    pub mean_mfu_pct: Option<f64>,
    pub attn_share: f64,
    pub peak_memory_gib: f64,
}

fn next_batch(loader: &mut Loader) -> Result<Batch> {
    loader
        .next_batch()
        .map_err(|e| TrainError::Invalid(format!("data: {e}")))?
        .ok_or_else(|| TrainError::Invalid("data: the training stream ended".into()))
}

/// Per-rank data states of a data-parallel checkpoint (world size > 1), next to `state.json`.
const DATA_STATES: &str = "data_states.json";

/// Trains `cfg` to `training.steps`, writing everything into the run directory. Under a launcher
/// (torchrun / Slurm variables) this process is one data-parallel rank.
pub fn train(cfg: &TrainConfig, opts: &RunOptions) -> Result<Summary> {
    let device = parse_device(&cfg.run.device)?;
    let mut ddp = Ddp::from_env(DdpOptions::default(), matches!(device, Device::Cuda(_)))?;
    let device = ddp.device(device);
    match train_rank(cfg, opts, &mut ddp, device) {
        Ok(s) => {
            ddp.shutdown()?;
            Ok(s)
        }
        Err(e) => {
            ddp.fail(&format!("rank {}: {e}", ddp.rank()));
            Err(e)
        }
    }
}

fn train_rank(cfg: &TrainConfig, opts: &RunOptions, ddp: &mut Ddp, device: Device) -> Result<Summary> {
    let main = ddp.is_main();
    let run_dir = cfg.run_dir();
    std::fs::create_dir_all(&run_dir).map_err(|e| TrainError::io(&run_dir, e))?;
    let config_toml = cfg.to_toml()?;
    if main {
        std::fs::write(run_dir.join("config.toml"), &config_toml).map_err(|e| TrainError::io(&run_dir, e))?;
    }
    let compute = compute_kind(&cfg.run.compute, device);
    let attn = cfg.attention.options()?;

    let resumed = if opts.resume {
        checkpoint::list(&run_dir)?.pop()
    } else {
        None
    };
    let resumed = resumed.map(|(_, dir)| checkpoint::load(&dir)).transpose()?;
    if let Some(r) = &resumed {
        let saved = TrainConfig::from_toml(&r.config_toml)?;
        if saved.model != cfg.model || saved.data != cfg.data {
            return Err(TrainError::Checkpoint(format!(
                "{} was made with a different [model] or [data] section; resume with the same ones",
                r.dir.display()
            )));
        }
    }

    if cfg.run.cpu_threads > 0 {
        tch::set_num_threads(cfg.run.cpu_threads as i32);
    }
    crate::attention::set_profile_cuda(cfg.run.profile_attention);
    tch::manual_seed(cfg.run.seed as i64);
    let data_state = match &resumed {
        Some(r) if ddp.world_size() > 1 => Some(rank_data_state(&r.dir, ddp.rank(), ddp.world_size())?),
        Some(r) => r.state.data.clone(),
        None => None,
    };
    let mut loader = Loader::new(&cfg.data, ddp.rank(), ddp.world_size(), data_state)
        .map_err(|e| TrainError::Invalid(format!("data: {e}")))?;
    let model = Llama::new(&cfg.model, loader.vocab_size(), device)?;
    let (n_params, n_emb) = model.shape.param_counts();
    tracing::info!(
        "model {}: {} parameters ({} non-embedding), {:?}, device {:?}, compute {:?}, attention {}",
        cfg.model.size,
        fmt_count(n_params),
        fmt_count(n_params - n_emb),
        model.shape,
        device,
        compute,
        cfg.attention.path
    );
    let params = model.named_parameters();
    let mut opt = AdamW::new(model.named_parameters(), &cfg.training, Llama::no_decay);

    let mut st = TrainState {
        step: 0,
        optimizer_updates: 0,
        data: None,
        rng_seed: cfg.run.seed,
        recent_losses: Vec::new(),
        skipped_steps: 0,
        tokens_seen: 0,
    };
    if let Some(r) = resumed {
        checkpoint::restore_params(&params, r.model)?;
        opt.load_state(r.optimizer, r.state.optimizer_updates)?;
        st = r.state;
        tch::manual_seed((st.rng_seed + st.step as u64) as i64);
        tracing::info!("resumed from {} at step {}", r.dir.display(), st.step);
    }
    // Every replica starts from rank 0's (restored) weights.
    ddp.attach(&params)?;
    let start_step = st.step;
    let mut jsonl = main
        .then(|| JsonlWriter::open(&run_dir, opts.resume.then_some(start_step)))
        .transpose()?;
    let mut wandb = main.then(|| Wandb::start(&cfg.wandb, &cfg.run.name, &config_toml, &run_dir));
    let progress = Progress::new(cfg.training.steps, start_step, cfg.run.progress && main);

    let tokens_per_step =
        (cfg.data.batch_rows * cfg.data.seq_len * cfg.training.grad_accum * ddp.world_size()) as u64;
    let flops_per_token = model.shape.flops_per_token(cfg.data.seq_len);
    let end = opts
        .stop_after
        .map_or(cfg.training.steps, |n| (start_step + n).min(cfg.training.steps));
    let (mut losses, mut tps_sum, mut mfu_sum, mut peak_mem) = (Vec::new(), 0.0, 0.0, 0.0);
    let (t_run, attn_run0) = (Instant::now(), callback_seconds());
    while st.step < end {
        ddp.check()?;
        let t0 = Instant::now();
        let attn0 = callback_seconds();
        let lr = lr_at(&cfg.training, st.step);
        let batches: Vec<Batch> = (0..cfg.training.grad_accum)
            .map(|_| next_batch(&mut loader))
            .collect::<Result<_>>()?;
        let targets_total: usize = batches.iter().map(|b| b.target_tokens()).sum::<usize>().max(1);
        let mut loss_total = 0.0;
        for b in &batches {
            let tokens: Vec<i64> = b.tokens.iter().map(|&t| t as i64).collect();
            let input = model.input(&tokens, &b.packed_cu_seqlens(), device)?;
            let targets = Tensor::from_slice(&b.targets).to_device(device);
            let logits = model.forward(&input, &attn, compute)?;
            let ls = loss_sum(&logits, &targets);
            (&ls / targets_total as f64).f_backward()?;
            loss_total += ls.double_value(&[]);
        }
        // Mean over ranks of gradients and loss: every rank then decides (skip, clip) alike.
        ddp.all_reduce_grads()?;
        let loss = ddp.mean(&[loss_total / targets_total as f64])?[0];
        let grad_norm = opt.grad_norm();
        let window_full =
            cfg.training.spike_window > 0 && st.recent_losses.len() >= cfg.training.spike_window;
        let mean_recent = st.recent_losses.iter().sum::<f64>() / st.recent_losses.len().max(1) as f64;
        let spike =
            cfg.training.spike_factor > 0.0 && window_full && loss > cfg.training.spike_factor * mean_recent;
        let skipped = !loss.is_finite() || !grad_norm.is_finite() || spike;
        if skipped {
            st.skipped_steps += 1;
            progress.println(format!(
                "step {}: update skipped (loss {loss:.4}, grad norm {grad_norm:.4}, recent mean {mean_recent:.4})",
                st.step + 1
            ));
            tracing::warn!(
                step = st.step + 1,
                loss,
                grad_norm,
                "skipped a non-finite or spiking step"
            );
        } else {
            if cfg.training.grad_clip > 0.0 && grad_norm > cfg.training.grad_clip {
                opt.scale_grads(cfg.training.grad_clip / (grad_norm + 1e-6));
            }
            opt.step(lr);
            st.recent_losses.push(loss);
            let excess = st
                .recent_losses
                .len()
                .saturating_sub(cfg.training.spike_window.max(1));
            st.recent_losses.drain(..excess);
        }
        opt.zero_grad();
        if let Device::Cuda(i) = device {
            tch::Cuda::synchronize(i as i64);
        }
        st.step += 1;
        st.tokens_seen += tokens_per_step;
        st.optimizer_updates = opt.t;
        st.data = Some(loader.state());

        let dt = t0.elapsed().as_secs_f64();
        let tps = tokens_per_step as f64 / dt;
        let mfu = matches!(device, Device::Cuda(_)).then(|| 100.0 * tps * flops_per_token / PEAK_BF16_FLOPS);
        let m = StepMetrics {
            step: st.step,
            loss,
            lr,
            grad_norm,
            skipped,
            tokens: st.tokens_seen,
            tps,
            mfu_pct: mfu,
            step_time_s: dt,
            attn_time_s: callback_seconds() - attn0,
            memory_gib: crate::memory::peak_gib(device, &mut peak_mem),
        };
        losses.push(loss);
        tps_sum += tps;
        mfu_sum += mfu.unwrap_or(0.0);
        progress.update(&m);
        if st.step.is_multiple_of(cfg.run.log_every) || st.step == end {
            if let Some(j) = jsonl.as_mut() {
                j.write(&m)?;
            }
            if let Some(w) = wandb.as_mut() {
                w.log(&m);
            }
        }
        let ckpt_due = cfg.run.checkpoint_every > 0 && st.step.is_multiple_of(cfg.run.checkpoint_every);
        if ckpt_due || st.step == end {
            // Collective (every rank, same steps): rank 0 stores every rank's data position.
            let states = if ddp.world_size() > 1 {
                let mine =
                    serde_json::to_vec(&loader.state()).map_err(|e| TrainError::Invalid(e.to_string()))?;
                ddp.gather(&mine)?
            } else {
                Vec::new()
            };
            if main {
                let dir = checkpoint::save(
                    &run_dir,
                    &st,
                    &params,
                    &opt.state_tensors(),
                    &config_toml,
                    cfg.run.keep_checkpoints,
                )?;
                if !states.is_empty() {
                    write_data_states(&dir, &states)?;
                }
                tracing::debug!("checkpoint {}", dir.display());
            }
        }
    }
    progress.finish();
    let n = losses.len().max(1);
    let tail = (n / 10).max(1);
    let wall = t_run.elapsed().as_secs_f64();
    let summary = Summary {
        run_dir: run_dir.clone(),
        attention_path: cfg.attention.path.clone(),
        device: format!("{device:?}"),
        params: n_params,
        steps: st.step,
        skipped_steps: st.skipped_steps,
        first_loss: losses.first().copied().unwrap_or(f64::NAN),
        final_loss: losses.last().copied().unwrap_or(f64::NAN),
        tail_mean_loss: losses.iter().rev().take(tail).sum::<f64>() / tail as f64,
        tokens: st.tokens_seen,
        wall_s: wall,
        mean_tps: tps_sum / n as f64,
        mean_mfu_pct: matches!(device, Device::Cuda(_)).then_some(mfu_sum / n as f64),
        attn_share: (callback_seconds() - attn_run0) / wall.max(1e-9),
        peak_memory_gib: peak_mem,
        losses,
    };
    if main {
        let json = serde_json::to_string_pretty(&summary).map_err(|e| TrainError::Invalid(e.to_string()))?;
        std::fs::write(run_dir.join("summary.json"), json).map_err(|e| TrainError::io(&run_dir, e))?;
    }
    if let Some(w) = wandb.as_mut() {
        w.finish(0, &summary);
    }
    Ok(summary)
}

/// Writes the gathered per-rank data states (JSON of each `DataState`, by rank) into `dir`.
/// The checkpoint directory is already renamed into place; a crash here leaves a checkpoint that
/// a multi-rank resume refuses (missing file) rather than one with wrong data positions.
fn write_data_states(dir: &std::path::Path, states: &[Vec<u8>]) -> Result<()> {
    let parsed: Vec<serde_json::Value> = states
        .iter()
        .map(|b| serde_json::from_slice(b))
        .collect::<std::result::Result<_, _>>()
        .map_err(|e| TrainError::Invalid(format!("a rank sent an unreadable data state: {e}")))?;
    let json = serde_json::to_vec_pretty(&parsed).map_err(|e| TrainError::Invalid(e.to_string()))?;
    let path = dir.join(DATA_STATES);
    std::fs::write(&path, json).map_err(|e| TrainError::io(&path, e))
}

/// Rank `rank`'s data state from a checkpoint made at `world_size` ranks.
fn rank_data_state(dir: &std::path::Path, rank: usize, world_size: usize) -> Result<flamia_data::DataState> {
    let path = dir.join(DATA_STATES);
    let text = std::fs::read(&path).map_err(|e| {
        TrainError::Checkpoint(format!(
            "{}: {e}; resuming with {world_size} ranks needs the per-rank data states of a checkpoint \
             made with {world_size} ranks (re-sharding to another world size is not implemented)",
            path.display()
        ))
    })?;
    let mut states: Vec<flamia_data::DataState> = serde_json::from_slice(&text)
        .map_err(|e| TrainError::Checkpoint(format!("{}: {e}", path.display())))?;
    if states.len() != world_size {
        return Err(TrainError::Checkpoint(format!(
            "{} holds {} ranks' data states, this run has {world_size} ranks; resume with the same world size",
            path.display(),
            states.len()
        )));
    }
    Ok(states.swap_remove(rank))
}

/// `1234567` -> `1.23M`.
pub fn fmt_count(n: usize) -> String {
    match n {
        n if n >= 1_000_000_000 => format!("{:.2}B", n as f64 / 1e9),
        n if n >= 1_000_000 => format!("{:.2}M", n as f64 / 1e6),
        n if n >= 1_000 => format!("{:.1}K", n as f64 / 1e3),
        n => n.to_string(),
    }
}
