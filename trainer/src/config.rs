//! The run configuration: one typed tree owned by the components, read from a TOML preset with
//! the `config` crate, then the environment (`FLAMIA__SECTION__KEY=value`), then `--set
//! section.key=value` overrides (in that order, later wins). Unknown keys are rejected with the
//! list of valid ones (serde `deny_unknown_fields`). The resolved tree is written into the run
//! directory as `config.toml`.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

pub use crate::determinism::Deterministic;
use crate::error::{Result, TrainError};
use crate::model::ModelConfig;

/// `[run]`: where and how the run happens.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RunConfig {
    /// Run name (W&B display name, default run directory `runs/<name>`).
    pub name: String,
    /// The run directory (checkpoints, metrics.jsonl, config.toml); empty = `runs/<name>`.
    pub dir: String,
    /// Seed of the initialisation (data order has its own `data.seed`).
    pub seed: u64,
    /// `auto` (CUDA if present, else CPU), `cpu`, `cuda` or `cuda:N`.
    pub device: String,
    /// Compute precision: `auto` (bf16 on CUDA, fp32 on CPU), `bf16`, `fp32`. Master weights and
    /// optimiser state are always fp32.
    pub compute: String,
    /// Log a metrics line every this many optimizer steps.
    pub log_every: usize,
    /// Checkpoint every this many optimizer steps (0: only at the end).
    pub checkpoint_every: usize,
    /// Checkpoints kept (older ones are deleted); at least 1.
    pub keep_checkpoints: usize,
    /// Write a checkpoint when the run ends (or stops early); false for throughput
    /// measurements, where a 1B checkpoint would take longer than the steps.
    pub final_checkpoint: bool,
    /// Show the progress bar (it is hidden anyway when stderr is not a terminal).
    pub progress: bool,
    /// libtorch CPU threads (intra-op); 0 keeps libtorch's default (all cores). On a small or
    /// shared CPU, 1 avoids OpenMP threads spinning against the attention reference's threads.
    pub cpu_threads: usize,
    /// Synchronise around each CUDA attention call to measure attention's share of the step
    /// (`attn_time_s`); costs two syncs per call.
    pub profile_attention: bool,
    /// Bitwise reproducible GPU training for A/B comparisons: `auto` (default: on for the FLAMIA
    /// paths, off for the `bf16` control; [`Deterministic::resolve`]), `true` or `false`. On:
    /// libtorch's deterministic algorithms (the `bf16` control's flash-attention backward
    /// switches to its deterministic variant; an operation without one is an error),
    /// deterministic cuDNN, `CUBLAS_WORKSPACE_CONFIG=:4096:8` (set by flamia before CUDA starts
    /// unless the device is `cpu`; another value already in the environment is refused; not set
    /// when off). Off, no path is bitwise repeatable on the GPU (libtorch's gradient of the tied
    /// embedding/output weight varies in its last bits; docs/training.md "Reproducibility");
    /// the CPU is repeatable either way. Cost: docs/perf.md.
    pub deterministic: Deterministic,
    /// In deterministic mode, let libtorch fill every uninitialised tensor it allocates
    /// (`at::empty`) with NaN, as `torch.use_deterministic_algorithms` does by default: a kernel
    /// reading memory nobody wrote then shows as NaN instead of as run-to-run noise, at the price
    /// of a fill per allocation. Off by default (flamia's kernels write every element they
    /// return); no effect outside the mode.
    pub fill_uninitialized_memory: bool,
}

impl Default for RunConfig {
    fn default() -> Self {
        RunConfig {
            name: "run".into(),
            dir: String::new(),
            seed: 0,
            device: "auto".into(),
            compute: "auto".into(),
            log_every: 10,
            checkpoint_every: 0,
            keep_checkpoints: 2,
            final_checkpoint: true,
            progress: true,
            cpu_threads: 0,
            profile_attention: false,
            deterministic: Deterministic::Auto,
            fill_uninitialized_memory: false,
        }
    }
}

/// `[attention]`: the attention path and FLAMIA precision options.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AttentionConfig {
    /// `bf16` (exact control), `mxfp8` (FLAMIA's main path; the default is `bf16`), `nvfp4`, `leaky-fp8` (negative control).
    pub path: String,
    /// One power-of-two scale per token instead of per 32-token block.
    pub per_token_scales: bool,
    /// dS exponents per query row instead of per 32x32 block.
    pub row_ds_exponents: bool,
    /// dQ prescale from the keys each query row sees.
    pub causal_dq_scaling: bool,
    /// Hadamard rotation of Q and K before quantising.
    pub hadamard: bool,
}

impl AttentionConfig {
    /// The kernels' options for this section: causal attention, the head dim's default scale.
    /// (Training and evaluation of a trained run both build their attention from it.)
    pub fn options(&self) -> Result<flamia_kernels::AttnOptions> {
        Ok(flamia_kernels::AttnOptions {
            path: crate::attention::parse_path(&self.path)?,
            precision: flamia_kernels::Precision {
                per_token_scales: self.per_token_scales,
                row_ds_exponents: self.row_ds_exponents,
                causal_dq_scaling: self.causal_dq_scaling,
                hadamard: self.hadamard,
            },
            causal: true,
            softmax_scale: None,
        })
    }
}

impl Default for AttentionConfig {
    fn default() -> Self {
        AttentionConfig {
            path: "bf16".into(),
            per_token_scales: false,
            row_ds_exponents: false,
            causal_dq_scaling: false,
            hadamard: true,
        }
    }
}

/// `[training]`: optimisation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TrainingConfig {
    /// Optimizer steps.
    pub steps: usize,
    /// Micro-batches (of `data.batch_rows` rows) accumulated per optimizer step.
    pub grad_accum: usize,
    /// Peak learning rate.
    pub lr: f64,
    /// Final learning rate as a fraction of the peak.
    pub min_lr_ratio: f64,
    /// Linear warm-up steps.
    pub warmup_steps: usize,
    /// `cosine` (decay from warm-up to the end) or `wsd` (warm-up, stable, then linear decay over
    /// the last `decay_fraction` of the steps).
    pub schedule: String,
    /// Decay share of the steps for `wsd` (0..=1).
    pub decay_fraction: f64,
    /// AdamW decoupled weight decay (not applied to norms and embeddings).
    pub weight_decay: f64,
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    /// Clip the global gradient norm to this (0 disables).
    pub grad_clip: f64,
    /// Skip a step whose loss exceeds this many times the mean of the last `spike_window` losses
    /// (0 disables; non-finite losses or gradients are always skipped).
    pub spike_factor: f64,
    /// Window of the loss-spike mean; spikes are only judged once the window is full.
    pub spike_window: usize,
    /// What the backward recomputes instead of keeping: `none` (keep every activation),
    /// `selective` (keep each block's input and its attention call, recompute norms,
    /// projections, RoPE and SwiGLU), `full` (keep each block's input, recompute the block).
    pub activation_checkpointing: String,
    /// Tokens per chunk of the output head + cross-entropy (the f32 logits of one chunk are what
    /// exists at a time); 0 = auto (at most 1 GiB of f32 logits per chunk).
    pub loss_chunk_tokens: usize,
    /// Validation every this many optimizer steps, and at the last step of a run at least this
    /// long (`training.steps`): the mean next-token loss through the training attention path on
    /// the validation split (`data.val`, or the part of `data.train` held out), logged as
    /// `val_loss` with that step's metrics. 0 disables it.
    pub val_every: usize,
    /// Tokens scored per validation pass, over all ranks together (each rank scores whole
    /// batches of its share until it reaches its part of the budget). The same tokens every
    /// pass: the first ones of the split.
    pub val_tokens: usize,
    /// With a FLAMIA attention path (not `bf16`), each validation pass scores the same tokens a
    /// second time through exact attention, logged as `val_loss_exact`: the number to judge
    /// quality by, since a kernel's own `val_loss` cannot show what the kernel gets wrong.
    pub val_exact: bool,
}

impl Default for TrainingConfig {
    fn default() -> Self {
        TrainingConfig {
            steps: 100,
            grad_accum: 1,
            lr: 3e-4,
            min_lr_ratio: 0.1,
            warmup_steps: 10,
            schedule: "cosine".into(),
            decay_fraction: 0.2,
            weight_decay: 0.1,
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-8,
            grad_clip: 1.0,
            spike_factor: 3.0,
            spike_window: 20,
            activation_checkpointing: "none".into(),
            loss_chunk_tokens: 0,
            val_every: 250,
            val_tokens: 1 << 20,
            val_exact: true,
        }
    }
}

/// `[wandb]`: Weights & Biases over its HTTP API (key from `WANDB_API_KEY`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WandbConfig {
    /// Log to W&B (needs `WANDB_API_KEY`; without it a warning is printed and nothing is sent).
    pub enabled: bool,
    /// Project name.
    pub project: String,
    /// Entity (user or team); empty = the key's default entity.
    pub entity: String,
    /// API base URL.
    pub base_url: String,
    /// Seconds between heartbeats (file_stream posts carry them).
    pub heartbeat_secs: u64,
}

impl Default for WandbConfig {
    fn default() -> Self {
        WandbConfig {
            enabled: false,
            project: "flamia".into(),
            entity: String::new(),
            base_url: "https://api.wandb.ai".into(),
            heartbeat_secs: 30,
        }
    }
}

/// `[distributed]`: data parallelism under a launcher (`docs/distributed.md`); ignored by a plain
/// single-process run except `stop_on_signal` and `background_checkpoint`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DistributedConfig {
    /// Seconds for the start-up: every rank joining the rendezvous, the agreement check
    /// (configuration, data, checkpoint, parameters) and the initial weight broadcast.
    pub startup_timeout_s: f64,
    /// Seconds one collective of a training step (gradient all-reduce, loss mean and stop vote)
    /// may take before the run fails as hung.
    pub collective_timeout_s: f64,
    /// Seconds the other ranks wait for rank 0's checkpoint I/O: reading the checkpoint to resume
    /// from, finishing the previous (background) write before the next checkpoint, the last
    /// write before the final barrier.
    pub checkpoint_timeout_s: f64,
    /// A rank without a heartbeat for this many seconds is declared dead; the others stop.
    pub heartbeat_timeout_s: f64,
    /// Precision of the gradient all-reduce: `f32` (exact sums) or `bf16` (half the bytes).
    pub reduce_dtype: String,
    /// Gradient bucket size, MiB (fractions allowed: tests use small buckets).
    pub bucket_mib: f64,
    /// Reduce each gradient bucket as soon as the backward has produced all its gradients
    /// (per-parameter autograd hooks; NCCL on a side stream), instead of after the backward.
    /// Results are the same as without it.
    pub overlap: bool,
    /// SIGTERM / SIGUSR1 (Slurm's preemption, time limit, `--signal`) make every rank stop at the
    /// same step after a checkpoint; the process exits with 75 so `launch/slurm.sbatch` requeues.
    pub stop_on_signal: bool,
    /// Copy the checkpoint to host memory and write it in a background thread while training
    /// goes on (rank 0 holds one host copy of weights and moments meanwhile).
    pub background_checkpoint: bool,
    /// ZeRO-1: each rank keeps the AdamW moments of 1/world of the parameters and updates only
    /// those; the parameters are then all-gathered. Same results as plain data parallelism
    /// (bitwise on CPU), a world-size-th of the moment memory.
    pub zero1: bool,
    /// At world size 1 through a launcher the per-step collectives (gradient reduction, ZeRO-1
    /// all-gather, metric mean) are identities and are skipped; `true` runs them anyway (to
    /// test the NCCL path on one GPU). Same results either way.
    pub force_collectives: bool,
}

impl Default for DistributedConfig {
    fn default() -> Self {
        DistributedConfig {
            startup_timeout_s: 900.0,
            collective_timeout_s: 300.0,
            checkpoint_timeout_s: 1800.0,
            heartbeat_timeout_s: 60.0,
            reduce_dtype: "f32".into(),
            bucket_mib: 25.0,
            overlap: false,
            stop_on_signal: true,
            background_checkpoint: true,
            zero1: false,
            force_collectives: false,
        }
    }
}

impl DistributedConfig {
    fn validate(&self) -> Result<()> {
        let timeouts = [
            self.startup_timeout_s,
            self.collective_timeout_s,
            self.checkpoint_timeout_s,
            self.heartbeat_timeout_s,
        ];
        if timeouts.iter().any(|t| !(t.is_finite() && *t > 0.0)) {
            return Err(invalid(
                "distributed.*_timeout_s must be positive numbers of seconds".into(),
            ));
        }
        let bucket_ok = self.bucket_mib.is_finite() && self.bucket_mib > 0.0;
        if !(matches!(self.reduce_dtype.as_str(), "f32" | "bf16") && bucket_ok) {
            return Err(invalid(format!(
                "distributed.reduce_dtype {:?}: allowed f32, bf16; distributed.bucket_mib must be > 0",
                self.reduce_dtype
            )));
        }
        Ok(())
    }
}

/// The whole run configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct TrainConfig {
    pub run: RunConfig,
    pub model: ModelConfig,
    pub attention: AttentionConfig,
    pub training: TrainingConfig,
    pub data: flamia_data::Config,
    pub wandb: WandbConfig,
    pub distributed: DistributedConfig,
}

fn invalid(msg: String) -> TrainError {
    TrainError::Config(msg)
}

impl TrainConfig {
    /// Reads `preset` (TOML), then `FLAMIA__SECTION__KEY` environment variables, then the
    /// `section.key=value` overrides, and validates the result.
    pub fn load(preset: Option<&Path>, overrides: &[String]) -> Result<TrainConfig> {
        let mut b = config::Config::builder();
        if let Some(p) = preset {
            if !p.exists() {
                return Err(invalid(format!(
                    "preset {} does not exist (presets live in configs/)",
                    p.display()
                )));
            }
            b = b.add_source(config::File::from(p).format(config::FileFormat::Toml));
        }
        b = b.add_source(
            config::Environment::with_prefix("FLAMIA")
                .prefix_separator("__")
                .separator("__")
                .try_parsing(true),
        );
        for o in overrides {
            let (k, v) = o
                .split_once('=')
                .ok_or_else(|| invalid(format!("--set takes section.key=value, got {o:?}")))?;
            let (k, v) = (k.trim(), v.trim());
            if !k.contains('.') {
                return Err(invalid(format!(
                    "--set key {k:?} must be section.key (sections: run, model, attention, training, data, wandb, distributed)"
                )));
            }
            b = b
                .set_override(k, parse_value(v))
                .map_err(|e| invalid(e.to_string()))?;
        }
        let raw = b.build().map_err(|e| invalid(e.to_string()))?;
        let cfg: TrainConfig = raw.try_deserialize().map_err(|e| invalid(e.to_string()))?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// Checks every section; messages say which key and what is allowed.
    pub fn validate(&self) -> Result<()> {
        self.model.validate()?;
        self.data.validate().map_err(|e| invalid(format!("data: {e}")))?;
        crate::attention::parse_path(&self.attention.path)
            .map_err(|e| invalid(format!("attention.path: {e}")))?;
        let t = &self.training;
        if t.steps == 0 || t.grad_accum == 0 {
            return Err(invalid(
                "training.steps and training.grad_accum must be at least 1".into(),
            ));
        }
        if !matches!(t.schedule.as_str(), "cosine" | "wsd") {
            return Err(invalid(format!(
                "training.schedule {:?}: allowed cosine, wsd",
                t.schedule
            )));
        }
        // (each test is written so that NaN fails it; infinities are refused by name)
        let finite = [
            ("lr", t.lr),
            ("eps", t.eps),
            ("weight_decay", t.weight_decay),
            ("grad_clip", t.grad_clip),
            ("spike_factor", t.spike_factor),
        ];
        if let Some((k, v)) = finite.iter().find(|(_, v)| !v.is_finite()) {
            return Err(invalid(format!("training.{k} = {v}: must be a finite number")));
        }
        if !(t.lr > 0.0 && (0.0..=1.0).contains(&t.min_lr_ratio) && (0.0..=1.0).contains(&t.decay_fraction)) {
            return Err(invalid(
                "training.lr must be > 0, min_lr_ratio and decay_fraction within 0..=1".into(),
            ));
        }
        if !((0.0..1.0).contains(&t.beta1) && (0.0..1.0).contains(&t.beta2) && t.eps > 0.0) {
            return Err(invalid(
                "training.beta1/beta2 must be in [0, 1) and eps > 0".into(),
            ));
        }
        if !(t.weight_decay >= 0.0 && t.grad_clip >= 0.0 && t.spike_factor >= 0.0) {
            return Err(invalid(
                "training.weight_decay, grad_clip and spike_factor must be >= 0".into(),
            ));
        }
        if t.spike_factor > 0.0 && t.spike_window == 0 {
            return Err(invalid(
                "training.spike_window must be at least 1 when training.spike_factor is set \
                 (spike_factor = 0 turns the spike check off)"
                    .into(),
            ));
        }
        if t.val_every > 0 && t.val_tokens == 0 {
            return Err(invalid(
                "training.val_tokens must be at least 1 when training.val_every is set (0 turns validation off)".into(),
            ));
        }
        crate::model::Checkpointing::parse(&t.activation_checkpointing)
            .map_err(|e| invalid(format!("training.activation_checkpointing: {e}")))?;
        if !matches!(self.run.compute.as_str(), "auto" | "bf16" | "fp32") {
            return Err(invalid(format!(
                "run.compute {:?}: allowed auto, bf16, fp32",
                self.run.compute
            )));
        }
        crate::device::check_setting(&self.run.device)?;
        self.distributed.validate()?;
        crate::determinism::check_env(crate::determinism::enabled(self)?)?;
        if self.run.keep_checkpoints == 0 || self.run.log_every == 0 {
            return Err(invalid(
                "run.keep_checkpoints and run.log_every must be at least 1".into(),
            ));
        }
        Ok(())
    }

    /// The run directory.
    pub fn run_dir(&self) -> PathBuf {
        if self.run.dir.is_empty() {
            Path::new("runs").join(&self.run.name)
        } else {
            PathBuf::from(&self.run.dir)
        }
    }

    /// The resolved config as TOML.
    pub fn to_toml(&self) -> Result<String> {
        toml::to_string_pretty(self).map_err(|e| invalid(format!("serialising the resolved config: {e}")))
    }

    /// Reads a resolved `config.toml` (from a run directory) without env or overrides.
    pub fn from_toml(text: &str) -> Result<TrainConfig> {
        let cfg = TrainConfig::from_saved_toml(text)?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// Reads the `config.toml` a checkpoint was made with, without validating it again: it was
    /// valid when it was written, and the checks that depend on this process's environment
    /// (deterministic mode's variables, the device) or on a later build's rules are not its own.
    pub fn from_saved_toml(text: &str) -> Result<TrainConfig> {
        toml::from_str(text).map_err(|e| invalid(e.to_string()))
    }
}

/// Values from `--set` keep their TOML type: numbers, booleans and arrays parse as such, anything
/// else is a string.
fn parse_value(v: &str) -> config::Value {
    match toml::from_str::<toml::Table>(&format!("x = {v}")) {
        Ok(mut t) => toml_to_config(t.remove("x").unwrap_or(toml::Value::String(v.into()))),
        Err(_) => config::Value::from(v.to_string()),
    }
}

fn toml_to_config(v: toml::Value) -> config::Value {
    match v {
        toml::Value::String(s) => s.into(),
        toml::Value::Integer(i) => i.into(),
        toml::Value::Float(f) => f.into(),
        toml::Value::Boolean(b) => b.into(),
        toml::Value::Array(a) => a.into_iter().map(toml_to_config).collect::<Vec<_>>().into(),
        other => other.to_string().into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::RmsNorm;

    #[test]
    fn model_rms_norm_defaults_to_fused_is_set_by_set_and_refuses_other_names() {
        let default = TrainConfig::load(None, &[]).unwrap();
        assert_eq!(default.model.rms_norm, "fused");
        // A config.toml written before the key existed (a run to resume) reads as the default.
        let toml = default.to_toml().unwrap();
        let old: String = toml
            .lines()
            .filter(|l| !l.starts_with("rms_norm"))
            .map(|l| format!("{l}\n"))
            .collect();
        assert_ne!(old, toml, "the resolved config names the key");
        assert_eq!(TrainConfig::from_toml(&old).unwrap().model, default.model);
        for (name, want) in RmsNorm::NAMES
            .iter()
            .zip([RmsNorm::Fused, RmsNorm::FusedF32, RmsNorm::Composite])
        {
            let cfg = TrainConfig::load(None, &[format!("model.rms_norm={name}")]).unwrap();
            assert_eq!(RmsNorm::parse(&cfg.model.rms_norm).unwrap(), want);
            let back = TrainConfig::from_toml(&cfg.to_toml().unwrap()).unwrap();
            assert_eq!(back.model.rms_norm, *name);
        }
        for bad in ["apex", "Fused", ""] {
            let e = TrainConfig::load(None, &[format!("model.rms_norm={bad}")])
                .unwrap_err()
                .to_string();
            assert!(
                e.contains(&format!("model.rms_norm {bad:?}"))
                    && e.contains("allowed: fused, fused-f32, composite"),
                "{e}"
            );
        }
    }

    #[test]
    fn one_rope_scaling_key_keeps_the_others_defaults() {
        let c = TrainConfig::load(None, &["model.rope_scaling.factor=8".into()]).unwrap();
        let d = crate::model::sizes::RopeScaling::default();
        assert_eq!(c.model.rope_scaling.factor, 8.0);
        assert_eq!(
            c.model.rope_scaling.original_max_position,
            d.original_max_position
        );
        assert_eq!(c.model.rope_scaling.high_freq_factor, d.high_freq_factor);
        let bad = TrainConfig::load(None, &["model.rope_scaling.fctor=8".into()]);
        assert!(bad.unwrap_err().to_string().contains("fctor"));
    }

    #[test]
    fn non_finite_training_numbers_and_a_spike_check_without_a_window_are_refused() {
        for (key, v) in [
            ("grad_clip", "nan"),
            ("weight_decay", "nan"),
            ("spike_factor", "nan"),
            ("lr", "inf"),
            ("eps", "inf"),
        ] {
            let e = TrainConfig::load(None, &[format!("training.{key}={v}")])
                .unwrap_err()
                .to_string();
            assert!(e.contains(&format!("training.{key}")), "{key} = {v}: {e}");
        }
        let e = TrainConfig::load(None, &["training.spike_window=0".into()])
            .unwrap_err()
            .to_string();
        assert!(e.contains("spike_window must be at least 1"), "{e}");
        TrainConfig::load(
            None,
            &["training.spike_window=0".into(), "training.spike_factor=0".into()],
        )
        .unwrap();
    }
}
