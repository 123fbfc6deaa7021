//! Metrics of a run: one [`StepMetrics`] record per logged step goes to the JSONL file in the run
//! directory (stable keys), the progress bar, and Weights & Biases; validation steps are always
//! logged and carry `val_loss`.

pub mod jsonl;
pub mod progress;
pub mod wandb;

use serde::Serialize;

/// H100/H200 dense BF16 peak, the MFU denominator (torchtitan's convention).
pub const PEAK_BF16_FLOPS: f64 = 989e12;

/// One logged step. Keys are stable: downstream tools (`flamia compare`) read them.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct StepMetrics {
    /// Optimizer step (1-based: the number of steps completed).
    pub step: usize,
    /// Mean next-token loss of this step's tokens.
    pub loss: f64,
    /// Learning rate used.
    pub lr: f64,
    /// Global gradient norm before clipping.
    pub grad_norm: f64,
    /// Whether the update was skipped (non-finite or spiking loss/gradient).
    pub skipped: bool,
    /// Input tokens consumed so far.
    pub tokens: u64,
    /// Input tokens per second over this step, all ranks together.
    pub tps: f64,
    /// Model FLOPs utilisation of this GPU in percent against 989 TFLOP/s (null on CPU): this
    /// rank's step FLOPs ([`crate::model::Shape::train_flops`] over its batches' documents) per
    /// second of step time.
    pub mfu_pct: Option<f64>,
    /// Wall time of this step in seconds.
    pub step_time_s: f64,
    /// Seconds of this step spent inside the attention bridge (forward + backward).
    pub attn_time_s: f64,
    /// Peak memory in GiB (GPU: device memory in use at its highest; CPU: process peak RSS).
    pub memory_gib: f64,
    /// Seconds spent building attention kernels since the previous logged line, validation
    /// passes included (the first launch of a kernel variant in this process: NVRTC or the disk
    /// cache, then the driver's load; seconds only on a machine that has not built the variant
    /// before). Only on lines after which kernels were built; the key is absent otherwise, so a
    /// slow step is told from slow kernels.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kernel_build_s: Option<f64>,
    /// Mean next-token loss on the validation split after this step's update (only on
    /// validation steps, `training.val_every`; the key is absent otherwise).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub val_loss: Option<f64>,
    /// Targets scored by that validation pass, all ranks together.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub val_tokens: Option<u64>,
    /// The same tokens' mean loss through exact attention (`training.val_exact`, FLAMIA paths).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub val_loss_exact: Option<f64>,
}
