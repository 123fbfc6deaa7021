//! The training loop, a step at a time ([`Run`]): batch (the step's micro-batches to the
//! device) -> forward/backward of each (chunked loss head, optional activation checkpointing;
//! gradients accumulate) -> reduce (gradients over ranks; the step's one host read: loss and
//! gradient norm) -> optimizer (non-finite/spike skip, clip, AdamW) -> metrics -> checkpoint.
//!
//! Inside a step the host does not wait for the device except for that one read (and, on logged
//! steps, a synchronise so the step time is complete); the next step's batch is moved to the
//! device right after the read, while the stream is idle, so its copies that wait for the stream
//! (`Packing::new`'s `cu_seqlens`) cost no second drain. Out of memory anywhere on this path is a
//! [`TrainError::OutOfMemory`] naming the phase, the memory in use and the remedies.
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
//!
//! Multi-rank safety (`docs/distributed.md`): on `--resume` rank 0 alone chooses and reads the
//! checkpoint (an unreadable newest one falls back to an older one) and broadcasts the choice and
//! the optimizer moments; the ranks then check that they agree on the configuration, the data
//! shards, the checkpoint and the parameters before the first step. SIGTERM / SIGUSR1 are voted
//! on with each step's loss mean, so every rank stops at the same step, after a checkpoint, and
//! [`Summary::stopped_by`] tells the CLI to exit with
//! [`flamia_dist::PREEMPTED_EXIT_CODE`]. Checkpoints are copied to host memory and written in the
//! background (`distributed.background_checkpoint`).

use std::path::PathBuf;
use std::time::Instant;

use flamia_data::{Batch, DataState, Loader};
use flamia_kernels::gpu::{kernel_builds, KernelBuilds};
use flamia_kernels::{AttnOptions, AttnPath};
use serde::Serialize;
use tch::{Device, Kind, Tensor};

use crate::attention::callback_seconds;
use crate::checkpoint::{self, Loaded, Snapshot, TrainState, DATA_STATES};
use crate::config::TrainConfig;
use crate::ddp::{Ddp, DdpOptions};
use crate::device::{compute_kind, parse_device};
use crate::error::{Result, TrainError};
use crate::metrics::jsonl::JsonlWriter;
use crate::metrics::progress::Progress;
use crate::metrics::wandb::Wandb;
use crate::metrics::{StepMetrics, PEAK_BF16_FLOPS};
use crate::model::{Checkpointing, Llama, PackedInput, Shape, StepOptions};
use crate::optim::{lr_at, AdamW};
use crate::validation::{ValResult, Validator};

/// How to run: resume or not, and where to stop early.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// Continue from the newest checkpoint in the run directory (fresh start if there is none).
    pub resume: bool,
    /// Stop (with a checkpoint) after this many optimizer steps of this invocation.
    pub stop_after: Option<usize>,
    /// A fresh start (no `resume`) in a run directory that holds checkpoints deletes them; without
    /// it such a start is refused (its checkpoints would mix with the earlier run's).
    pub overwrite: bool,
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
    /// `(step, validation loss)` of every validation pass of this invocation.
    pub val_losses: Vec<(usize, f64)>,
    /// The same passes through exact attention (`training.val_exact`, FLAMIA paths).
    pub val_losses_exact: Vec<(usize, f64)>,
    /// Set when the run stopped early on SIGTERM / SIGUSR1 (after its checkpoint): the signal as
    /// seen by this rank, or that another rank saw one. The CLI then exits with 75.
    pub stopped_by: Option<String>,
}

fn next_batch(loader: &mut Loader) -> Result<Batch> {
    loader
        .next_batch()
        .map_err(|e| TrainError::Invalid(format!("data: {e}")))?
        .ok_or_else(|| TrainError::Invalid("data: the training stream ended".into()))
}

/// Trains `cfg` to `training.steps`, writing everything into the run directory. Under a launcher
/// (torchrun / Slurm variables) this process is one data-parallel rank.
pub fn train(cfg: &TrainConfig, opts: &RunOptions) -> Result<Summary> {
    // First, before libtorch touches CUDA (even to probe for it): the cuBLAS workspace
    // configuration has to be in the environment before the first cuBLAS handle.
    crate::determinism::apply(cfg)?;
    let device = parse_device(&cfg.run.device)?;
    tracing::info!("run.device {:?}: {device:?}", cfg.run.device);
    let (dopts, gopts) = DdpOptions::from_config(&cfg.distributed)?;
    let mut ddp = Ddp::from_env(dopts, &gopts, matches!(device, Device::Cuda(_)))?;
    let device = ddp.device(device);
    match train_rank(cfg, opts, &mut ddp, device) {
        Ok(s) => {
            ddp.shutdown()?;
            Ok(s)
        }
        // (every rank decided this from the same plan: a clean end, not a failure)
        Err(e @ TrainError::Complete(_)) => {
            ddp.shutdown()?;
            Err(e)
        }
        // (`train_rank` told the group already)
        Err(e) => Err(e),
    }
}

/// Tells the other ranks this one is failing with `e`, and returns `e`, or `e` as a
/// [`TrainError::PeerFailure`] where the group had failed before it surfaced (a peer's death or
/// error, or a hung collective), which the exit status tells a launcher. Call it once per error,
/// before anything else tells the group (after this rank's own `fail`, the group has failed too).
fn fail_group(ddp: &Ddp, e: TrainError) -> TrainError {
    // (a complete run is not a failure: every rank decided it from the same plan)
    if matches!(e, TrainError::PeerFailure(_) | TrainError::Complete(_)) {
        return e;
    }
    let peer = ddp.group_failure();
    ddp.fail(&format!("rank {}: {e}", ddp.rank()));
    match peer {
        Some(_) => TrainError::PeerFailure(e.to_string()),
        None => e,
    }
}

/// The training loop of one rank, a step at a time: batch, forward/backward, reduce, optimizer,
/// metrics, checkpoint.
fn train_rank(cfg: &TrainConfig, opts: &RunOptions, ddp: &mut Ddp, device: Device) -> Result<Summary> {
    let mut run = Run::start(cfg, opts, ddp, device).map_err(|e| fail_group(ddp, e))?;
    if let Err(e) = run_steps(&mut run, cfg, ddp) {
        // The other ranks learn of it now, before `run` drops and its checkpoint writer is
        // joined (they would otherwise wait in a collective meanwhile and time out with a
        // reason of their own). This rank's exit grace (`FLAMIA_DIST_EXIT_GRACE_S`) then bounds
        // that join when there are several ranks.
        return Err(fail_group(ddp, e));
    }
    run.finish().map_err(|e| fail_group(ddp, e))
}

/// The steps of this invocation (`train_rank`'s loop).
fn run_steps(run: &mut Run, cfg: &TrainConfig, ddp: &mut Ddp) -> Result<()> {
    // From here on a stop signal is worth a checkpoint (before, the default action, exiting, is
    // right: there is nothing to save).
    if cfg.distributed.stop_on_signal {
        flamia_dist::signal::install(&flamia_dist::signal::STOP_SIGNALS)
            .map_err(|e| TrainError::Invalid(e.to_string()))?;
        tracing::info!(
            "SIGTERM / SIGUSR1 from here on: the ranks stop at the same step, checkpoint and exit {}",
            flamia_dist::PREEMPTED_EXIT_CODE
        );
    }
    let mut next: Option<Step> = None;
    while run.st.step < run.end {
        ddp.check()?;
        let t0 = Instant::now();
        let attn0 = callback_seconds();
        let builds0 = kernel_builds();
        let step = match next.take() {
            Some(s) => s,
            None => run.batch(ddp)?,
        };
        let loss_sum = run.forward_backward(ddp, &step)?;
        let (loss, grad_norm) = run.reduce(ddp, &loss_sum, &step)?;
        // The read in `reduce` left the stream idle: the next step's micro-batches go to the
        // device now, so the copies that wait for the stream (`Packing::new`'s `cu_seqlens`)
        // wait for nothing, and the next forward's kernels queue right behind the optimizer's.
        if run.st.step + 1 < run.end {
            next = Some(run.batch(ddp)?);
        }
        let lr = lr_at(&cfg.training, run.st.step);
        let skipped = run.optimizer(ddp, loss, grad_norm, lr, &step)?;
        let timing = run.timing(t0, attn0, builds0);
        let val = run.validate(ddp)?;
        run.metrics(&step, timing, loss, grad_norm, lr, skipped, val)?;
        run.checkpoint(ddp)?;
        if run.stopped_by.is_some() && run.st.step < run.end {
            let why = run.stopped_by.clone().unwrap_or_default();
            // (the log line prints above the bar: progress.rs)
            tracing::warn!("step {}: stopping on {why}; checkpoint written", run.st.step);
            break;
        }
    }
    Ok(())
}

/// One optimizer step's micro-batches, on the device.
struct Step {
    micro: Vec<Micro>,
    /// Targets that count in the loss, over all micro-batches.
    targets: usize,
    /// What the step's summed token loss is divided by: the mean over ranks of `targets`, so that
    /// the ranks' averaged gradients and losses are the exact mean over every rank's target
    /// tokens (this rank's own count at world size 1).
    denom: f64,
    /// This rank's model FLOPs for the step ([`crate::model::Shape::train_flops`]).
    flops: f64,
    /// The data position right after this step's micro-batches (the loader may have been read
    /// further, for the next step, by the time this step is checkpointed).
    data: DataState,
}

struct Micro {
    input: PackedInput,
    targets: Tensor,
    tokens: usize,
}

/// Everything a rank's loop carries from step to step.
struct Run<'a> {
    cfg: &'a TrainConfig,
    device: Device,
    main: bool,
    run_dir: PathBuf,
    config_toml: String,
    attn: AttnOptions,
    compute: Kind,
    checkpointing: Checkpointing,
    model: Llama,
    params: Vec<(String, Tensor)>,
    n_params: usize,
    opt: AdamW,
    loader: Loader,
    st: TrainState,
    end: usize,
    jsonl: Option<JsonlWriter>,
    wandb: Option<Wandb>,
    progress: Progress,
    /// Tokens per step over all ranks.
    tokens_per_step: u64,
    world_size: usize,
    losses: Vec<f64>,
    tps_sum: f64,
    mfu_sum: f64,
    peak_mem: f64,
    t_run: Instant,
    attn_run0: f64,
    /// The kernel builds up to the last logged metrics line (`kernel_build_s` reports the ones
    /// after it).
    builds_logged: KernelBuilds,
    /// `FLAMIA_TRACE_CHECKSUMS`: per-step gradient checksums (docs/training.md).
    trace: Option<crate::determinism::Trace>,
    /// Validation during training (`training.val_every`), if on and there is a split.
    validator: Option<Validator>,
    val_losses: Vec<(usize, f64)>,
    val_losses_exact: Vec<(usize, f64)>,
    /// Rank 0's checkpoint being written in the background.
    writer: checkpoint::Writer,
    /// Background checkpoint writes that failed since the last one that did not.
    failed_writes: usize,
    /// Set when the ranks voted to stop (a stop signal on some rank).
    stopped_by: Option<String>,
    /// ZeRO-1: this rank updates its range of the parameters, then they are all-gathered.
    zero1: bool,
}

/// What rank 0 tells every rank before the first step when resuming: the checkpoint it chose
/// (`None`: start fresh), or why there is none it can use.
#[derive(Debug, Serialize, serde::Deserialize)]
struct ResumePlan {
    dir: PathBuf,
    state: TrainState,
    config_toml: String,
    /// Every rank's data position (world size > 1).
    data_states: Option<Vec<DataState>>,
}

/// A step's wall time and attention seconds, taken before any validation pass, and the kernel
/// builds it ran into.
struct Timing {
    dt: f64,
    attn: f64,
    builds: KernelBuilds,
}

/// The log line for a step that spent a second or more building kernels, so its step time is
/// not read as the kernels' speed; `None` below that.
fn build_note(step: usize, builds: KernelBuilds, step_s: f64) -> Option<String> {
    let (n, secs) = (builds.modules, builds.seconds);
    (n > 0 && secs >= 1.0).then(|| {
        format!(
            "step {step}: {secs:.1} s of its {step_s:.1} s built {n} attention kernel module{} (the \
             first use of a kernel variant in this process; the PTX is cached on disk and the \
             driver caches the machine code, so later runs on this machine skip most of it)",
            if n == 1 { "" } else { "s" }
        )
    })
}

impl<'a> Run<'a> {
    /// Run directory, resume, seeding, data, model, optimizer, replicas in step, loggers.
    fn start(cfg: &'a TrainConfig, opts: &RunOptions, ddp: &mut Ddp, device: Device) -> Result<Run<'a>> {
        let main = ddp.is_main();
        let run_dir = cfg.run_dir();
        std::fs::create_dir_all(&run_dir).map_err(|e| TrainError::io(&run_dir, e))?;
        let config_toml = cfg.to_toml()?;
        let compute = compute_kind(&cfg.run.compute, device);
        let attn = cfg.attention.options()?;
        // Exact attention on CUDA is libtorch's flash kernel, which takes BF16/FP16 only: a
        // float32 run would fail there at its first step (bf16 path) or first validation.
        let exact_on_cuda =
            attn.path == AttnPath::Exact || (cfg.training.val_exact && cfg.training.val_every > 0);
        if device.is_cuda() && compute == Kind::Float && exact_on_cuda {
            return Err(TrainError::Invalid(format!(
                "run.compute = {:?} on CUDA: exact attention there ({}) is libtorch's flash kernel, \
                 which takes bf16 only; use run.compute = \"bf16\" (master weights and optimizer \
                 state stay float32){}",
                cfg.run.compute,
                if attn.path == AttnPath::Exact {
                    "the bf16 path"
                } else {
                    "training.val_exact's validation pass"
                },
                if attn.path == AttnPath::Exact {
                    ""
                } else {
                    ", or training.val_exact = false"
                }
            )));
        }
        let checkpointing = Checkpointing::parse(&cfg.training.activation_checkpointing)?;

        // Rank 0 alone reads the checkpoint; the others get its choice (and, after `attach`,
        // the weights and moments), so N ranks never read N copies and never pick different ones.
        let (plan, loaded) = if opts.resume {
            resume_plan(&run_dir, ddp)?
        } else {
            fresh_start(&run_dir, opts.overwrite, ddp)?;
            (None, None)
        };
        if let Some(r) = &plan {
            let path = r.dir.join("config.toml");
            let saved = TrainConfig::from_saved_toml(&r.config_toml)
                .map_err(|e| TrainError::Checkpoint(format!("{}: {e}", path.display())))?;
            check_resume_config(&saved, cfg, &path)?;
            // Raising training.steps is how a finished run goes on; say what that does to the
            // schedule, which is a function of training.steps.
            let more = "raise training.steps to train further (the learning-rate schedule is \
                        computed from it: a finished cosine or WSD decay starts again from where the \
                        longer schedule is at that step)";
            if r.state.step == cfg.training.steps {
                return Err(TrainError::Complete(format!(
                    "the run in {} is complete: its checkpoint {} is at training.steps = {}; nothing \
                     to train ({more})",
                    run_dir.display(),
                    r.dir.display(),
                    r.state.step
                )));
            }
            if r.state.step > cfg.training.steps {
                return Err(TrainError::Checkpoint(format!(
                    "{} is at step {}, past training.steps = {}; {more}",
                    r.dir.display(),
                    r.state.step,
                    cfg.training.steps
                )));
            }
        }
        // (only now: a refused resume leaves the run's config.toml as it was)
        if main {
            crate::checkpoint::write_atomic(&run_dir.join("config.toml"), config_toml.as_bytes())?;
        }

        if cfg.run.cpu_threads > 0 {
            tch::set_num_threads(cfg.run.cpu_threads as i32);
        }
        crate::attention::set_profile_cuda(cfg.run.profile_attention);
        tch::manual_seed(cfg.run.seed as i64);
        let data_state = match &plan {
            Some(ResumePlan {
                data_states: Some(states),
                ..
            }) => Some(states[ddp.rank()].clone()),
            Some(r) => r.state.data.clone(),
            None => None,
        };
        let loader = Loader::new(&cfg.data, ddp.rank(), ddp.world_size(), data_state)
            .map_err(|e| TrainError::Invalid(format!("data: {e}")))?;
        check_gpu_head_dim(cfg, &attn, &cfg.model.shape(loader.vocab_size())?, device)?;
        let setup = || "the model and optimizer set-up".to_string();
        let model = Llama::new(&cfg.model, loader.vocab_size(), device)
            .map_err(|e| crate::memory::explain_in(e, setup, device, crate::memory::Phase::State))?;
        let (n_params, n_emb) = model.shape.param_counts();
        tracing::info!(
            "model {}: {} parameters ({} non-embedding), {:?}, device {:?}, compute {:?}, attention {}, \
             activation checkpointing {}",
            cfg.model.size,
            fmt_count(n_params),
            fmt_count(n_params - n_emb),
            model.shape,
            device,
            compute,
            cfg.attention.path,
            cfg.training.activation_checkpointing
        );
        let params = model.named_parameters();
        let mut opt = AdamW::new(model.named_parameters(), &cfg.training, Llama::no_decay)
            .map_err(|e| crate::memory::explain_in(e, setup, device, crate::memory::Phase::State))?;

        let mut st = TrainState {
            step: 0,
            optimizer_updates: 0,
            data: None,
            rng_seed: cfg.run.seed,
            recent_losses: Vec::new(),
            skipped_steps: 0,
            tokens_seen: 0,
        };
        if let Some(l) = loaded {
            checkpoint::restore_params(&params, l.model)?;
            opt.load_state(l.optimizer, l.state.optimizer_updates)?;
        }
        if let Some(r) = &plan {
            opt.t = r.state.optimizer_updates;
            st = r.state.clone();
            tch::manual_seed((st.rng_seed + st.step as u64) as i64);
            tracing::info!("resumed from {} at step {}", r.dir.display(), st.step);
        }
        // Every replica starts from rank 0's (restored) weights and moments.
        ddp.attach(&params)?;
        let moments = opt.state_tensors()?;
        if plan.is_some() {
            let tensors: Vec<Tensor> = moments.iter().map(|(_, t)| t.shallow_clone()).collect();
            ddp.broadcast(&tensors)?;
        }
        // Before the first step: the ranks must agree on what they train (an error names what
        // differs, e.g. one rank's shard list after a read error, or a different --set).
        let resumed_from = plan.as_ref().map_or("none".to_string(), |r| {
            format!("{} (step {})", r.dir.display(), r.state.step)
        });
        ddp.agree(&[
            ("configuration", config_toml.clone()),
            ("data shard list", loader.shards().join("\n")),
            (
                "data fingerprint (shards, tokenizer, seed, stream settings)",
                loader.state().fingerprint,
            ),
            ("resume checkpoint", resumed_from),
            ("parameters (name, shape, f64 sum)", checksums(&params)?),
            ("optimizer moments (name, shape, f64 sum)", checksums(&moments)?),
        ])?;
        drop(moments);
        // (World size 1 shards trivially: the whole range, gathered from itself.)
        let zero1 = cfg.distributed.zero1;
        if zero1 {
            let range = ddp.zero_range(opt.numel());
            tracing::info!(
                "ZeRO-1: rank {} keeps the moments of and updates elements {range:?} of {}",
                ddp.rank(),
                opt.numel()
            );
            opt.shard_moments(range)?;
            // With overlap: gradients reduced to their owner only (a reduce-scatter by bucket).
            ddp.shard_gradients(opt.flat_grads());
        }
        let start_step = st.step;
        let validator = Validator::new(cfg, ddp.rank(), ddp.world_size())?;
        let jsonl = main
            .then(|| JsonlWriter::open(&run_dir, opts.resume.then_some(start_step)))
            .transpose()?;
        let resumed_at = plan.as_ref().map(|r| r.state.step);
        let wandb = main.then(|| Wandb::start(&cfg.wandb, &cfg.run.name, &config_toml, &run_dir, resumed_at));
        let progress = Progress::new(cfg.training.steps, start_step, cfg.run.progress && main);
        let end = opts
            .stop_after
            .map_or(cfg.training.steps, |n| (start_step + n).min(cfg.training.steps));
        Ok(Run {
            cfg,
            device,
            main,
            run_dir,
            config_toml,
            attn,
            compute,
            checkpointing,
            model,
            params,
            n_params,
            opt,
            loader,
            st,
            end,
            jsonl,
            wandb,
            progress,
            tokens_per_step: (cfg.data.batch_rows
                * cfg.data.seq_len
                * cfg.training.grad_accum
                * ddp.world_size()) as u64,
            world_size: ddp.world_size(),
            losses: Vec::new(),
            tps_sum: 0.0,
            mfu_sum: 0.0,
            peak_mem: 0.0,
            t_run: Instant::now(),
            attn_run0: callback_seconds(),
            builds_logged: kernel_builds(),
            trace: crate::determinism::Trace::from_env(),
            validator,
            val_losses: Vec::new(),
            val_losses_exact: Vec::new(),
            writer: checkpoint::Writer::default(),
            failed_writes: 0,
            stopped_by: None,
            zero1,
        })
    }

    fn oom(&self, e: TrainError, what: impl FnOnce() -> String) -> TrainError {
        let full_checkpointing = self.checkpointing == Checkpointing::Full;
        crate::memory::explain_in(
            e,
            what,
            self.device,
            crate::memory::Phase::Step { full_checkpointing },
        )
    }

    /// A step's `grad_accum` micro-batches, read and moved to the device before any compute
    /// (the host-to-device copies that wait for the stream wait here, once, not between
    /// micro-batches; the loop calls it while the stream is idle).
    /// Collective with several ranks (the target counts' mean): every rank calls it at the same
    /// points of the loop, after the previous step's collectives have completed.
    fn batch(&mut self, ddp: &Ddp) -> Result<Step> {
        let n = self.cfg.training.grad_accum;
        let mut step = Step {
            micro: Vec::with_capacity(n),
            targets: 0,
            denom: 0.0,
            flops: 0.0,
            data: self.loader.state(),
        };
        for i in 0..n {
            let b = next_batch(&mut self.loader)?;
            let cu = b.packed_cu_seqlens();
            step.flops += self.model.shape.train_flops(cu.windows(2).map(|w| w[1] - w[0]));
            step.targets += b.target_tokens();
            let tokens: Vec<i64> = b.tokens.iter().map(|&t| t as i64).collect();
            let micro = (|| -> Result<Micro> {
                Ok(Micro {
                    input: self.model.input(&tokens, &cu, self.device)?,
                    targets: crate::model::host_to_device(&b.targets, self.device)?,
                    tokens: tokens.len(),
                })
            })()
            .map_err(|e| self.oom(e, || format!("moving micro-batch {} of {n} to the device", i + 1)))?;
            step.micro.push(micro);
        }
        step.targets = step.targets.max(1);
        // (a rank's gradient is summed over its targets / denom, then averaged over the ranks:
        // sum over all targets / (world x mean) = the mean over all of them; dividing by its own
        // count instead weighted a token by 1 / (world x its rank's count))
        step.denom = if self.world_size > 1 {
            ddp.mean(&[step.targets as f64])?[0]
        } else {
            step.targets as f64
        };
        step.data = self.loader.state();
        Ok(step)
    }

    /// Forward and backward of every micro-batch; gradients accumulate, the loss sum stays on
    /// the device. `ddp` learns which backward is the step's last (overlapped reduction).
    fn forward_backward(&self, ddp: &Ddp, step: &Step) -> Result<Tensor> {
        let opts = self.step_options();
        let n = step.micro.len();
        let mut total: Option<Tensor> = None;
        for (i, m) in step.micro.iter().enumerate() {
            ddp.begin_backward(i + 1 == n);
            let ls = self
                .model
                .forward_backward(&m.input, &m.targets, step.denom, &opts)
                .map_err(|e| {
                    self.oom(e, || {
                        format!(
                            "the forward/backward of micro-batch {} of {n} ({} tokens, activation checkpointing {})",
                            i + 1,
                            m.tokens,
                            self.cfg.training.activation_checkpointing
                        )
                    })
                })?;
            total = Some(match total {
                None => ls,
                Some(t) => t.f_add(&ls)?,
            });
        }
        total.ok_or_else(|| TrainError::Invalid("a step needs at least one micro-batch".into()))
    }

    /// Gradients averaged over ranks, then the one read of the step: mean loss and gradient
    /// norm come to the host together (the skip and clip decisions need them).
    fn reduce(&mut self, ddp: &mut Ddp, loss_sum: &Tensor, step: &Step) -> Result<(f64, f64)> {
        ddp.all_reduce_grads()
            .map_err(|e| self.oom(e, || "the gradient all-reduce".into()))?;
        // ZeRO-1 with sharded reduction: this rank's part of the norm, combined below.
        let sharded = self.zero1 && ddp.grads_sharded();
        let pair = (|| -> Result<Vec<f64>> {
            let loss = loss_sum.f_to_kind(Kind::Double)?.f_div_scalar(step.denom)?;
            let norm = match sharded {
                true => self.opt.grad_norm_of(ddp.zero_range(self.opt.numel()))?,
                false => self.opt.grad_norm()?,
            }
            .f_to_kind(Kind::Double)?;
            let both = Tensor::f_stack(&[loss, norm], 0)?.f_to_device(Device::Cpu)?;
            Ok(Vec::<f64>::try_from(&both)?)
        })()
        .map_err(|e| self.oom(e, || "the loss and gradient norm".into()))?;
        // Mean over ranks of the loss, and the stop vote riding along (no extra round trip):
        // every rank then decides (skip, clip, stop) alike.
        let signal = flamia_dist::signal::requested();
        let mut vals = vec![pair[0], f64::from(u8::from(signal.is_some()))];
        if sharded {
            vals.push(pair[1] * pair[1]);
        }
        let mean = ddp.mean(&vals)?;
        let loss = mean[0];
        let grad_norm = match sharded {
            true => (mean[2] * ddp.world_size() as f64).sqrt(),
            false => pair[1],
        };
        if mean[1] > 0.0 && self.stopped_by.is_none() {
            self.stopped_by = Some(match signal {
                Some(sig) => flamia_dist::signal::name(sig),
                None => "a stop signal received by another rank".into(),
            });
        }
        if let Some(t) = &self.trace {
            t.step(self.st.step + 1, loss, &self.params)?;
        }
        Ok((loss, grad_norm))
    }

    /// Skips a non-finite or spiking step, else clips and updates; gradients are zeroed either
    /// way. Returns whether the update was skipped.
    fn optimizer(&mut self, ddp: &Ddp, loss: f64, grad_norm: f64, lr: f64, step: &Step) -> Result<bool> {
        let cfg: &'a TrainConfig = self.cfg;
        let t = &cfg.training;
        let st = &mut self.st;
        let window_full = t.spike_window > 0 && st.recent_losses.len() >= t.spike_window;
        let mean_recent = st.recent_losses.iter().sum::<f64>() / st.recent_losses.len().max(1) as f64;
        let spike = t.spike_factor > 0.0 && window_full && loss > t.spike_factor * mean_recent;
        let skipped = !loss.is_finite() || !grad_norm.is_finite() || spike;
        if skipped {
            st.skipped_steps += 1;
            tracing::warn!(
                "step {}: update skipped, a non-finite or spiking step (loss {loss:.4}, grad norm \
                 {grad_norm:.4}, recent mean {mean_recent:.4})",
                st.step + 1
            );
        } else {
            let device = self.device;
            let update = |opt: &mut AdamW| -> Result<()> {
                if t.grad_clip > 0.0 && grad_norm > t.grad_clip {
                    opt.scale_grads(t.grad_clip / (grad_norm + 1e-6))?;
                }
                opt.step(lr)
            };
            update(&mut self.opt).map_err(|e| {
                crate::memory::explain_in(
                    e,
                    || "the optimizer step".into(),
                    device,
                    crate::memory::Phase::State,
                )
            })?;
            if self.zero1 {
                // Every rank updated its own range: put the others' in place.
                ddp.all_gather_in_place(self.opt.flat_params())?;
            }
            st.recent_losses.push(loss);
            let excess = st.recent_losses.len().saturating_sub(t.spike_window.max(1));
            st.recent_losses.drain(..excess);
        }
        self.opt.zero_grad()?;
        st.step += 1;
        st.tokens_seen += self.tokens_per_step;
        st.optimizer_updates = self.opt.t;
        st.data = Some(step.data.clone());
        Ok(skipped)
    }

    fn step_options(&self) -> StepOptions<'_> {
        StepOptions {
            attn: &self.attn,
            compute: self.compute,
            checkpointing: self.checkpointing,
            loss_chunk_tokens: self.cfg.training.loss_chunk_tokens,
        }
    }

    /// Whether the step just completed is logged: every `log_every` steps, the last step of
    /// this invocation, and every validation step.
    fn logged(&self) -> bool {
        let s = self.st.step;
        s.is_multiple_of(self.cfg.run.log_every)
            || s == self.end
            || self.validator.as_ref().is_some_and(|v| v.due(s))
    }

    /// The step's wall time and attention seconds; logged steps wait for the device first (only
    /// those do, so their step time is complete).
    fn timing(&self, t0: Instant, attn0: f64, builds0: KernelBuilds) -> Timing {
        if let (true, Device::Cuda(i)) = (self.logged(), self.device) {
            tch::Cuda::synchronize(i as i64);
        }
        Timing {
            dt: t0.elapsed().as_secs_f64(),
            attn: callback_seconds() - attn0,
            builds: kernel_builds().since(&builds0),
        }
    }

    /// A validation pass after the step's update, when one is due (`training.val_every`).
    fn validate(&mut self, ddp: &Ddp) -> Result<Option<ValResult>> {
        let s = self.st.step;
        if !self.validator.as_ref().is_some_and(|v| v.due(s)) {
            return Ok(None);
        }
        let Some(mut v) = self.validator.take() else {
            return Ok(None);
        };
        // The training path's pass, then (FLAMIA paths) the same tokens through exact attention.
        let exact = (self.cfg.training.val_exact && self.attn.path != AttnPath::Exact).then(|| AttnOptions {
            path: AttnPath::Exact,
            precision: Default::default(),
            ..self.attn
        });
        let r = v
            .run(
                &self.model,
                &self.step_options(),
                self.device,
                ddp,
                &self.progress,
            )
            .and_then(|mut r| {
                if let Some(attn) = &exact {
                    let opts = StepOptions {
                        attn,
                        ..self.step_options()
                    };
                    let e = v.run(&self.model, &opts, self.device, ddp, &self.progress)?;
                    r.exact_loss = Some(e.loss);
                    r.seconds += e.seconds;
                } else if self.cfg.training.val_exact {
                    // the exact path's own pass is the exact one: logged under both names, so a
                    // BF16 control has the series its FP8 arms are compared with
                    r.exact_loss = Some(r.loss);
                }
                Ok(r)
            });
        self.validator = Some(v);
        let r = r?;
        self.val_losses.push((s, r.loss));
        if let Some(e) = r.exact_loss {
            self.val_losses_exact.push((s, e));
        }
        let line = format!(
            "step {s}: validation loss {:.4}{} ({} tokens, {:.1} s)",
            r.loss,
            r.exact_loss
                .filter(|_| exact.is_some())
                .map(|e| format!(", exact attention {e:.4}"))
                .unwrap_or_default(),
            r.tokens,
            r.seconds
        );
        // (every rank logs it; the line prints above the bar: progress.rs)
        tracing::info!("{line}");
        Ok(Some(r))
    }

    /// Step time, tokens/s, MFU, memory; the progress bar every step, the metrics file and W&B
    /// on logged steps (with the validation loss on validation steps).
    #[allow(clippy::too_many_arguments)]
    fn metrics(
        &mut self,
        step: &Step,
        timing: Timing,
        loss: f64,
        grad_norm: f64,
        lr: f64,
        skipped: bool,
        val: Option<ValResult>,
    ) -> Result<()> {
        let s = self.st.step;
        let logged = self.logged();
        let dt = timing.dt;
        let tps = self.tokens_per_step as f64 / dt;
        let mfu = matches!(self.device, Device::Cuda(_)).then(|| 100.0 * step.flops / dt / PEAK_BF16_FLOPS);
        // the kernel builds since the previous logged line (validation passes' included)
        let kernel_build_s = if logged {
            let now = kernel_builds();
            let b = now.since(&self.builds_logged);
            self.builds_logged = now;
            (b.modules > 0).then_some(b.seconds)
        } else {
            None
        };
        let m = StepMetrics {
            step: s,
            loss,
            lr,
            grad_norm,
            skipped,
            tokens: self.st.tokens_seen,
            tps,
            mfu_pct: mfu,
            step_time_s: dt,
            attn_time_s: timing.attn,
            memory_gib: crate::memory::peak_gib(self.device, &mut self.peak_mem),
            kernel_build_s,
            val_loss: val.map(|v| v.loss),
            val_tokens: val.map(|v| v.tokens),
            val_loss_exact: val.and_then(|v| v.exact_loss),
        };
        // (every rank logs it: each builds its own kernels)
        if let Some(line) = build_note(s, timing.builds, dt) {
            tracing::info!("{line}");
        }
        self.losses.push(loss);
        self.tps_sum += tps;
        self.mfu_sum += mfu.unwrap_or(0.0);
        self.progress.update(&m);
        if logged {
            if let Some(j) = self.jsonl.as_mut() {
                j.write(&m)?;
            }
            if let Some(w) = self.wandb.as_mut() {
                w.log(&m);
            }
        }
        Ok(())
    }

    /// A checkpoint every `checkpoint_every` steps, at the end (unless `run.final_checkpoint` is
    /// off) and when the ranks voted to stop. Periodic ones are written in the background
    /// (`distributed.background_checkpoint`); the last one of the invocation is complete on disk
    /// before this returns.
    fn checkpoint(&mut self, ddp: &mut Ddp) -> Result<()> {
        let s = self.st.step;
        let every = self.cfg.run.checkpoint_every;
        let at_end = s == self.end && self.cfg.run.final_checkpoint;
        let stopping = self.stopped_by.is_some() && s < self.end;
        if !((every > 0 && s.is_multiple_of(every)) || at_end || stopping) {
            return Ok(());
        }
        // Rank 0 first finishes the previous write; the others meanwhile wait in the gather
        // below, under the checkpoint I/O timeout (not the collectives').
        if self.main {
            match self.writer.wait() {
                Ok(Some(dir)) => {
                    tracing::debug!("checkpoint {} written", dir.display());
                    self.failed_writes = 0;
                }
                Ok(None) => {}
                // (the writer logged it when it failed) this step's checkpoint is still worth
                // writing once: the space may be back, and a stop must leave one behind; two in
                // a row stop the run rather than let it train on without checkpoints
                Err(e) => after_failed_write(&mut self.failed_writes, e, s)?,
            }
        }
        // Collective (every rank, same steps): rank 0 stores every rank's data position.
        let extra = if self.world_size > 1 {
            let mine = serde_json::to_vec(&self.st.data).map_err(|e| TrainError::Invalid(e.to_string()))?;
            vec![(DATA_STATES.to_string(), data_states_json(&ddp.gather(&mine)?)?)]
        } else {
            Vec::new()
        };
        // ZeRO-1: the checkpoint holds the full moments, gathered from every rank's range.
        let gathered = if self.zero1 {
            let (m, v) = self.opt.flat_moments();
            let n = self.opt.numel();
            Some((ddp.gather_ranges(m, n)?, ddp.gather_ranges(v, n)?))
        } else {
            None
        };
        if self.main {
            let moments = match &gathered {
                Some((m, v)) => self.opt.state_tensors_of(m, v)?,
                None => self.opt.state_tensors()?,
            };
            let snap = Snapshot::take(&self.st, &self.params, &moments, &self.config_toml, extra)?;
            let keep = self.cfg.run.keep_checkpoints;
            if self.cfg.distributed.background_checkpoint && !at_end && !stopping {
                self.writer.start(snap, &self.run_dir, keep)?;
            } else {
                let dir = snap.write(&self.run_dir, keep)?;
                tracing::debug!("checkpoint {} written", dir.display());
            }
        }
        // A periodic checkpoint written in the foreground: the other ranks wait here, under the
        // checkpoint I/O timeout, not in the next step's collectives under theirs (at the end
        // or on a stop the group's shutdown waits the same way).
        if !self.cfg.distributed.background_checkpoint && !at_end && !stopping {
            ddp.checkpoint_barrier()?;
        }
        Ok(())
    }

    /// The summary (written by rank 0) and the end of the W&B run.
    fn finish(mut self) -> Result<Summary> {
        self.writer.wait()?;
        self.progress.finish();
        let n = self.losses.len().max(1);
        let tail = (n / 10).max(1);
        let wall = self.t_run.elapsed().as_secs_f64();
        let cuda = matches!(self.device, Device::Cuda(_));
        let summary = Summary {
            run_dir: self.run_dir.clone(),
            attention_path: self.cfg.attention.path.clone(),
            device: format!("{:?}", self.device),
            params: self.n_params,
            steps: self.st.step,
            skipped_steps: self.st.skipped_steps,
            first_loss: self.losses.first().copied().unwrap_or(f64::NAN),
            final_loss: self.losses.last().copied().unwrap_or(f64::NAN),
            tail_mean_loss: self.losses.iter().rev().take(tail).sum::<f64>() / tail as f64,
            tokens: self.st.tokens_seen,
            wall_s: wall,
            mean_tps: self.tps_sum / n as f64,
            mean_mfu_pct: cuda.then_some(self.mfu_sum / n as f64),
            attn_share: (callback_seconds() - self.attn_run0) / wall.max(1e-9),
            peak_memory_gib: self.peak_mem,
            losses: std::mem::take(&mut self.losses),
            val_losses: std::mem::take(&mut self.val_losses),
            val_losses_exact: std::mem::take(&mut self.val_losses_exact),
            // (a stop that came during the run's last step: the run is complete, and the exit
            // status must not ask a launcher to requeue it)
            stopped_by: self
                .stopped_by
                .clone()
                .filter(|_| self.st.step < self.cfg.training.steps),
        };
        if let (Some(why), None) = (&self.stopped_by, &summary.stopped_by) {
            tracing::info!(
                "{why} came during the run's last step (step {}): the run is complete, exiting 0",
                self.st.step
            );
        }
        if self.main {
            let json =
                serde_json::to_string_pretty(&summary).map_err(|e| TrainError::Invalid(e.to_string()))?;
            checkpoint::write_atomic(&self.run_dir.join("summary.json"), json.as_bytes())?;
        }
        if let Some(w) = self.wandb.as_mut() {
            // (a stopped run exits 75 for a requeue, within the scheduler's kill grace)
            match summary.stopped_by {
                Some(_) => w.finish_within(
                    flamia_dist::PREEMPTED_EXIT_CODE,
                    &summary,
                    std::time::Duration::from_secs(3),
                ),
                None => w.finish(0, &summary),
            }
        }
        Ok(summary)
    }
}

/// A background checkpoint write failed (the writer logged it): the first of a row is only
/// logged and the checkpoint of `step` is still written (the space may be back, and a stop must
/// leave one behind); a second in a row stops the run rather than let it train on without
/// checkpoints. `failed` counts them (reset by a write that succeeds).
fn after_failed_write(failed: &mut usize, e: TrainError, step: usize) -> Result<()> {
    *failed += 1;
    if *failed >= 2 {
        return Err(TrainError::Checkpoint(format!(
            "{failed} checkpoints in a row were not written, the last: {e}; stopping rather than \
             training on without one (free the space, then --resume from the newest complete \
             checkpoint)"
        )));
    }
    tracing::warn!("the previous checkpoint failed ({e}); writing step {step}'s");
    Ok(())
}

/// A fresh start in `run_dir` (rank 0): refused while the directory holds an earlier run's
/// checkpoints (the new run's would be pruned against them, and a later `--resume` could pick
/// the old run's), unless `overwrite` deletes them.
fn fresh_start(run_dir: &std::path::Path, overwrite: bool, ddp: &Ddp) -> Result<()> {
    // Rank 0 decides; every rank gets its answer (as `resume_plan` does), so none goes on to
    // build a model for a start that was refused.
    if !ddp.is_main() {
        let answer: std::result::Result<(), String> = serde_json::from_slice(&ddp.broadcast_bytes(None)?)
            .map_err(|e| TrainError::Checkpoint(format!("rank 0's start check is unreadable: {e}")))?;
        return answer.map_err(|e| TrainError::Checkpoint(format!("rank 0 refused the start: {e}")));
    }
    let r = fresh_start_here(run_dir, overwrite);
    let answer: std::result::Result<(), String> = r.as_ref().map(|_| ()).map_err(|e| e.to_string());
    let bytes = serde_json::to_vec(&answer).map_err(|e| TrainError::Checkpoint(e.to_string()))?;
    if ddp.world_size() > 1 {
        ddp.broadcast_bytes(Some(&bytes))?;
    }
    r
}

/// Rank 0's part of [`fresh_start`].
fn fresh_start_here(run_dir: &std::path::Path, overwrite: bool) -> Result<()> {
    let existing = checkpoint::list(run_dir)?;
    let Some((newest, _)) = existing.last() else {
        return Ok(());
    };
    if !overwrite {
        return Err(TrainError::Checkpoint(format!(
            "{} already holds {} checkpoint(s) of a run (newest: step {newest}); continue that run \
             with --resume, give this one another run.name or run.dir, or pass --overwrite to \
             delete them",
            run_dir.join("checkpoints").display(),
            existing.len()
        )));
    }
    let n = checkpoint::remove_all(run_dir)?;
    tracing::warn!(
        "--overwrite: deleted {n} checkpoint(s) of an earlier run (newest: step {newest}) from {}",
        run_dir.join("checkpoints").display()
    );
    Ok(())
}

/// `[data]` keys that may change when resuming: they do not move the data stream (its
/// fingerprint guards the ones that do) or the model.
const DATA_KEYS_FREE_ON_RESUME: [&str; 4] = ["batch_rows", "num_threads", "prefetch", "skip_bad_shards"];

/// The keys of `section` whose values differ between two configs: (`section.key`, saved, now).
fn section_changes(saved: &TrainConfig, now: &TrainConfig, section: &str) -> Vec<(String, String, String)> {
    let table = |c: &TrainConfig| {
        toml::Value::try_from(c)
            .ok()
            .and_then(|v| v.get(section).and_then(|s| s.as_table().cloned()))
            .unwrap_or_default()
    };
    let (a, b) = (table(saved), table(now));
    let mut keys: Vec<&String> = a.keys().chain(b.keys()).collect();
    keys.sort();
    keys.dedup();
    let show = |v: Option<&toml::Value>| v.map_or("(unset)".to_string(), |v| v.to_string());
    keys.into_iter()
        .filter(|k| a.get(*k) != b.get(*k))
        .map(|k| (format!("{section}.{k}"), show(a.get(k)), show(b.get(k))))
        .collect()
}

/// Resuming with a config other than the checkpoint's (`path`, its `config.toml`): a different
/// `[model]`, or a `[data]` key that moves the stream, is refused, naming every key; changes to
/// `[training]` and `[attention]` are allowed (longer runs, an A/B of the attention path from a
/// shared checkpoint) and logged.
fn check_resume_config(saved: &TrainConfig, now: &TrainConfig, path: &std::path::Path) -> Result<()> {
    let mut refused = section_changes(saved, now, "model");
    refused.extend(
        section_changes(saved, now, "data")
            .into_iter()
            .filter(|(k, _, _)| !DATA_KEYS_FREE_ON_RESUME.iter().any(|f| k == &format!("data.{f}"))),
    );
    if !refused.is_empty() {
        let list: Vec<String> = refused
            .iter()
            .map(|(k, a, b)| format!("{k} = {b} (the checkpoint's: {a})"))
            .collect();
        return Err(TrainError::Checkpoint(format!(
            "resuming from {} with a different model or data stream: {}; resume with the \
             checkpoint's values (only data.{} may change)",
            path.display(),
            list.join(", "),
            DATA_KEYS_FREE_ON_RESUME.join(", data.")
        )));
    }
    for section in ["data", "training", "attention"] {
        for (k, a, b) in section_changes(saved, now, section) {
            tracing::warn!("resuming with {k} = {b} (the checkpoint was made with {a})");
        }
    }
    if saved.data.batch_rows != now.data.batch_rows && now.training.val_every > 0 {
        tracing::warn!(
            "validation scores whole batches of data.batch_rows rows up to training.val_tokens: \
             after this resume it may score other tokens than before (val_loss before and after \
             are not strictly comparable)"
        );
    }
    Ok(())
}

/// FLAMIA's GPU kernels take head dim 64 or 128 (the v3.1 kernels of the NVFP4 path and the v3 /
/// promotion switches 128 only: `gpu::check_head_dim`): a FLAMIA path on CUDA with a head dim its
/// kernels do not take is refused before the model is built, naming the shape and what to change
/// (on the CPU the reference implementation takes 64 and 128).
fn check_gpu_head_dim(
    cfg: &TrainConfig,
    opts: &flamia_kernels::AttnOptions,
    shape: &Shape,
    device: Device,
) -> Result<()> {
    if !device.is_cuda() || opts.path == AttnPath::Exact {
        return Ok(());
    }
    let Err(e) = flamia_kernels::gpu::check_head_dim(opts, shape.head_dim, false) else {
        return Ok(());
    };
    let sizes: Vec<&str> = crate::model::SIZES
        .iter()
        .filter(|s| flamia_kernels::gpu::check_head_dim(opts, s.dim / s.n_heads, false).is_ok())
        .map(|s| s.name)
        .collect();
    Err(TrainError::Invalid(format!(
        "attention.path = {:?} runs FLAMIA's GPU kernels: {e}. model.size {:?} has head_dim {} (dim {} / \
         {} heads). Use attention.path = \"bf16\" for this model, or a model.size these options run: {}",
        cfg.attention.path,
        cfg.model.size,
        shape.head_dim,
        shape.dim,
        shape.n_heads,
        sizes.join(", ")
    )))
}

/// The gathered per-rank data states (JSON of each `DataState`, by rank) as the content of
/// [`DATA_STATES`], written into the checkpoint before it is renamed into place.
fn data_states_json(states: &[Vec<u8>]) -> Result<Vec<u8>> {
    let parsed: Vec<serde_json::Value> = states
        .iter()
        .map(|b| serde_json::from_slice(b))
        .collect::<std::result::Result<_, _>>()
        .map_err(|e| TrainError::Invalid(format!("a rank sent an unreadable data state: {e}")))?;
    serde_json::to_vec_pretty(&parsed).map_err(|e| TrainError::Invalid(e.to_string()))
}

/// Every rank's data state from a checkpoint made at `world_size` ranks.
fn read_data_states(dir: &std::path::Path, world_size: usize) -> Result<Vec<DataState>> {
    let path = dir.join(DATA_STATES);
    let text = std::fs::read(&path).map_err(|e| {
        TrainError::Checkpoint(format!(
            "{}: {e}; resuming with {world_size} ranks needs the per-rank data states of a checkpoint \
             made with {world_size} ranks (re-sharding to another world size is not implemented)",
            path.display()
        ))
    })?;
    let states: Vec<DataState> = serde_json::from_slice(&text)
        .map_err(|e| TrainError::Checkpoint(format!("{}: {e}", path.display())))?;
    if states.len() != world_size {
        return Err(TrainError::Checkpoint(format!(
            "{} holds {} ranks' data states, this run has {world_size} ranks; resume with the same world size",
            path.display(),
            states.len()
        )));
    }
    Ok(states)
}

/// Rank 0 chooses the checkpoint to resume from (the newest usable one: it loads, and holds the
/// data states this world size needs) and broadcasts the choice; every rank gets the plan, rank
/// 0 also the loaded tensors. An error on rank 0 (checkpoints exist but none is usable) reaches
/// every rank.
fn resume_plan(run_dir: &std::path::Path, ddp: &Ddp) -> Result<(Option<ResumePlan>, Option<Loaded>)> {
    let world = ddp.world_size();
    let decode = |bytes: &[u8]| -> Result<std::result::Result<Option<ResumePlan>, String>> {
        serde_json::from_slice(bytes)
            .map_err(|e| TrainError::Checkpoint(format!("rank 0's resume plan is unreadable: {e}")))
    };
    if !ddp.is_main() {
        let plan = decode(&ddp.broadcast_bytes(None)?)?
            .map_err(|e| TrainError::Checkpoint(format!("rank 0 could not choose a checkpoint: {e}")))?;
        return Ok((plan, None));
    }
    let chosen = checkpoint::load_newest(run_dir, |l| {
        if world > 1 {
            read_data_states(&l.dir, world).map(|_| ())
        } else {
            Ok(())
        }
    })
    .and_then(|l| {
        let Some(l) = l else { return Ok(None) };
        let data_states = (world > 1).then(|| read_data_states(&l.dir, world)).transpose()?;
        let plan = ResumePlan {
            dir: l.dir.clone(),
            state: l.state.clone(),
            config_toml: l.config_toml.clone(),
            data_states,
        };
        Ok(Some((plan, l)))
    });
    let message: std::result::Result<Option<&ResumePlan>, String> = match &chosen {
        Ok(c) => Ok(c.as_ref().map(|(p, _)| p)),
        Err(e) => Err(e.to_string()),
    };
    let bytes = serde_json::to_vec(&message).map_err(|e| TrainError::Checkpoint(e.to_string()))?;
    ddp.broadcast_bytes(Some(&bytes))?;
    Ok(match chosen? {
        Some((plan, l)) => (Some(plan), Some(l)),
        None => (None, None),
    })
}

/// One line per tensor: name, shape and the f64 sum of its values (bit pattern), for the
/// start-up agreement. One device-to-host read for all of them.
fn checksums(tensors: &[(String, Tensor)]) -> Result<String> {
    if tensors.is_empty() {
        return Ok(String::new());
    }
    let sums: Vec<Tensor> = tensors
        .iter()
        .map(|(_, t)| t.f_sum(Kind::Double))
        .collect::<std::result::Result<_, _>>()?;
    let sums: Vec<f64> = Vec::try_from(&Tensor::f_stack(&sums, 0)?.f_to_device(Device::Cpu)?)?;
    Ok(tensors
        .iter()
        .zip(sums)
        .map(|((n, t), s)| format!("{n} {:?} {:016x}", t.size(), s.to_bits()))
        .collect::<Vec<_>>()
        .join("\n"))
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

#[cfg(test)]
mod tests {
    use super::*;

    fn kb(modules: u64, seconds: f64) -> KernelBuilds {
        KernelBuilds { modules, seconds }
    }

    #[test]
    fn steps_that_built_kernels_for_a_second_or_more_say_so() {
        assert_eq!(build_note(3, kb(0, 0.0), 0.4), None, "no builds");
        assert_eq!(
            build_note(3, kb(2, 0.2), 0.6),
            None,
            "builds from the caches are quick: no line"
        );
        let line = build_note(8, kb(1, 3.78), 4.01).unwrap();
        assert!(
            line.starts_with("step 8: 3.8 s of its 4.0 s built 1 attention kernel module "),
            "{line}"
        );
        let line = build_note(1, kb(14, 6.79), 7.55).unwrap();
        assert!(line.contains("built 14 attention kernel modules"), "{line}");
    }

    #[test]
    fn flamia_paths_on_cuda_refuse_head_dims_their_kernels_do_not_take() {
        let cfg = |size: &str, path: &str, extra: &[&str]| {
            let mut sets = vec![format!("model.size={size}"), format!("attention.path={path}")];
            sets.extend(extra.iter().map(|s| s.to_string()));
            TrainConfig::load(None, &sets).unwrap()
        };
        let cuda = Device::Cuda(0);
        let check = |c: &TrainConfig, device| {
            let shape = c.model.shape(256).unwrap();
            check_gpu_head_dim(c, &c.attention.options().unwrap(), &shape, device)
        };
        // tiny: 2 heads of 64; the v4 kernels take it, the v3.1 ones (nvfp4) do not
        for (path, extra) in [
            ("mxfp8", &[][..]),
            ("leaky-fp8", &[]),
            ("mxfp8", &["attention.row_ds_exponents=true"]),
        ] {
            let r = check(&cfg("tiny", path, extra), cuda);
            assert!(r.is_ok(), "{path} {extra:?} runs on v4 at head_dim 64: {r:?}");
        }
        {
            let c = cfg("tiny", "nvfp4", &[]);
            let err = check(&c, cuda).unwrap_err().to_string();
            assert!(
                err.contains("head_dim 64") && err.contains("\"bf16\"") && err.contains("125m"),
                "{err}"
            );
            assert!(
                check(&c, Device::Cpu).is_ok(),
                "the CPU reference takes head_dim 64"
            );
        }
        assert!(
            check(&cfg("tiny", "bf16", &[]), cuda).is_ok(),
            "the bf16 control runs any head_dim"
        );
        assert!(
            check(&cfg("125m", "nvfp4", &[]), cuda).is_ok(),
            "125m has head_dim 128"
        );
    }

    #[test]
    fn one_failed_checkpoint_write_is_survived_and_two_in_a_row_stop_the_run() {
        let fail = || TrainError::Checkpoint("disk full".into());
        let mut failed = 0;
        after_failed_write(&mut failed, fail(), 10).unwrap();
        let e = after_failed_write(&mut failed, fail(), 20)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("2 checkpoints in a row") && e.contains("disk full"),
            "{e}"
        );
        // A write that succeeds in between resets the count (Run::checkpoint).
        let mut failed = 0;
        after_failed_write(&mut failed, fail(), 10).unwrap();
        failed = 0;
        after_failed_write(&mut failed, fail(), 30).unwrap();
    }
}
