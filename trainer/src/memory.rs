//! Peak memory for the metrics: GPU memory in use at its highest (driver view: what the caching
//! allocator holds, like torchtitan's `memory/max_reserved`), or the process's peak RSS on CPU;
//! and out-of-memory errors turned into [`TrainError::OutOfMemory`] that say what ran, how much
//! memory was in use and what to change.

use tch::Device;

use crate::error::TrainError;

/// Whether an error message is an allocation failure (libtorch's CUDA caching allocator, its CPU
/// allocator's "can't allocate memory", or a CUDA driver call of the attention kernels).
pub fn is_out_of_memory(msg: &str) -> bool {
    let m = msg.to_ascii_lowercase();
    [
        "out of memory",
        "out_of_memory",
        "can't allocate memory",
        "not enough memory",
        "failed to allocate",
    ]
    .iter()
    .any(|p| m.contains(p))
}

/// Which part of a run ran out of memory: what helps differs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// A training step's forward/backward (and what is moved or reduced for it); `full`: the
    /// activation checkpointing is already `full`.
    Step { full_checkpointing: bool },
    /// Building the model and optimizer, or the optimizer's update: parameters and moments.
    State,
    /// A validation or evaluation batch (no gradients, no optimizer).
    Validation,
}

impl Phase {
    /// What to change, in the words of the config.
    pub fn remedies(self) -> String {
        match self {
            Phase::Step { full_checkpointing } => {
                let ckpt = if full_checkpointing {
                    ""
                } else {
                    "training.activation_checkpointing = \"selective\" or \"full\"; "
                };
                format!(
                    "{ckpt}shorter rows (data.seq_len); fewer rows per micro-batch (data.batch_rows, \
                     raising training.grad_accum keeps the batch)"
                )
            }
            Phase::State => "a smaller model (model.size); distributed.zero1 = true with several GPUs \
                             (each keeps a share of the optimizer moments); a device with more memory"
                .into(),
            Phase::Validation => "fewer rows per batch (data.batch_rows: validation scores whole batches \
                                  of it) or shorter rows (data.seq_len); training.val_every = 0 turns \
                                  validation off"
                .into(),
        }
    }
}

/// Turns an out-of-memory failure during `what` into [`TrainError::OutOfMemory`] (memory in use
/// on `device` now, the allocator's first message line, the remedies of a training step); other
/// errors pass through unchanged.
pub fn explain(e: TrainError, what: impl FnOnce() -> String, device: Device) -> TrainError {
    explain_in(
        e,
        what,
        device,
        Phase::Step {
            full_checkpointing: false,
        },
    )
}

/// [`explain`] with the remedies of `phase`.
pub fn explain_in(e: TrainError, what: impl FnOnce() -> String, device: Device, phase: Phase) -> TrainError {
    let msg = match &e {
        TrainError::Tch(t) => t.to_string(),
        TrainError::Attention(m) => m.clone(),
        _ => return e,
    };
    if !is_out_of_memory(&msg) {
        return e;
    }
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    let in_use = match device {
        Device::Cuda(i) => match cuda_mem_info() {
            Some((used, total)) => {
                format!("{:.2} GiB of {:.2} GiB in use on cuda:{i}", gib(used), gib(total))
            }
            None => format!("memory in use on cuda:{i} unknown"),
        },
        _ => match cpu_rss_bytes("VmRSS:") {
            Some(b) => format!("{:.2} GiB resident in this process", gib(b)),
            None => "resident memory unknown".into(),
        },
    };
    let first = msg
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or("")
        .chars()
        .take(400)
        .collect();
    TrainError::OutOfMemory {
        what: what(),
        in_use,
        detail: first,
        remedies: phase.remedies(),
    }
}

/// Current peak in GiB for `device` (0 when unknown).
pub fn peak_gib(device: Device, peak_so_far: &mut f64) -> f64 {
    let now = match device {
        Device::Cuda(_) => cuda_mem_info().map_or(0, |(used, _)| used) as f64,
        _ => cpu_rss_bytes("VmHWM:").unwrap_or(0) as f64,
    } / (1u64 << 30) as f64;
    *peak_so_far = peak_so_far.max(now);
    *peak_so_far
}

/// A `/proc/self/status` memory line (`VmHWM:` peak, `VmRSS:` now) in bytes.
fn cpu_rss_bytes(key: &str) -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with(key))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// (bytes in use, total bytes) of the current CUDA device.
fn cuda_mem_info() -> Option<(u64, u64)> {
    // libtorch has made its primary context current on this thread by now.
    let (free, total) = cudarc::driver::result::mem_get_info().ok()?;
    Some(((total - free) as u64, total as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn out_of_memory_becomes_an_explained_error_and_others_pass_through() {
        let raw = "CUDA out of memory. Tried to allocate 15.66 GiB. GPU 0 has a total capacity of 139.81 GiB\n\
                   Exception raised from malloc at c10/cuda/CUDACachingAllocator.cpp:1234 (most recent call first):\n\
                   frame #0: ...";
        let e = explain(
            TrainError::Tch(tch::TchError::Torch(raw.into())),
            || "the forward/backward of micro-batch 1 of 4 (16384 tokens)".into(),
            Device::Cpu,
        );
        let text = e.to_string();
        assert!(matches!(e, TrainError::OutOfMemory { .. }), "{text}");
        assert!(
            text.contains("micro-batch 1 of 4") && text.contains("Tried to allocate 15.66 GiB"),
            "{text}"
        );
        assert!(text.contains("GiB resident"), "{text}");
        assert!(
            text.contains("activation_checkpointing")
                && text.contains("data.seq_len")
                && text.contains("data.batch_rows"),
            "{text}"
        );
        assert!(!text.contains("frame #0"), "no backtrace: {text}");
        let attn = explain(
            TrainError::Attention(
                "cuMemAlloc: DriverError(CUDA_ERROR_OUT_OF_MEMORY, \"out of memory\")".into(),
            ),
            || "x".into(),
            Device::Cpu,
        );
        assert!(matches!(attn, TrainError::OutOfMemory { .. }));
        // A real allocation failure of libtorch (CPU allocator) is recognised too.
        let real = tch::Tensor::f_empty([1i64 << 58], (tch::Kind::Float, Device::Cpu)).unwrap_err();
        let real = explain(TrainError::Tch(real), || "x".into(), Device::Cpu);
        assert!(matches!(real, TrainError::OutOfMemory { .. }), "{real}");
        let other = explain(TrainError::Invalid("shape".into()), || "x".into(), Device::Cpu);
        assert!(matches!(other, TrainError::Invalid(_)));
        let other = explain(
            TrainError::Tch(tch::TchError::Torch("bad shape".into())),
            || "x".into(),
            Device::Cpu,
        );
        assert!(matches!(other, TrainError::Tch(_)));
    }

    #[test]
    fn the_remedies_fit_the_phase_that_ran_out() {
        let oom = || {
            TrainError::Tch(tch::TchError::Torch(
                "CUDA out of memory. Tried to allocate 1 GiB".into(),
            ))
        };
        let text = |phase| explain_in(oom(), || "x".into(), Device::Cpu, phase).to_string();
        // Checkpointing already full: not suggested again; the rows still help.
        let t = text(Phase::Step {
            full_checkpointing: true,
        });
        assert!(
            !t.contains("activation_checkpointing") && t.contains("data.batch_rows"),
            "{t}"
        );
        // Parameters and moments: rows and checkpointing do not help.
        let t = text(Phase::State);
        assert!(
            t.contains("zero1") && !t.contains("data.seq_len") && !t.contains("activation"),
            "{t}"
        );
        // Validation keeps no activations for a backward.
        let t = text(Phase::Validation);
        assert!(
            t.contains("val_every") && !t.contains("activation") && !t.contains("grad_accum"),
            "{t}"
        );
    }
}
