//! Checkpoints: `<run>/checkpoints/step_NNNNNNNN/` holding `model.safetensors` (f32 master
//! weights), `optimizer.safetensors` (AdamW moments), `state.json` (step, optimizer update count,
//! data state, RNG, loss-spike window) and `config.toml` (the resolved config). Written into a
//! `.tmp` directory first and renamed into place, so a crash never leaves a half checkpoint under
//! the final name; the last `keep` are kept.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use tch::Tensor;

use crate::error::{Result, TrainError};

/// Everything besides tensors needed to continue a run exactly.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainState {
    /// Optimizer steps completed.
    pub step: usize,
    /// AdamW updates applied (steps minus skipped ones).
    pub optimizer_updates: u64,
    /// The data loader's position after the last consumed batch.
    pub data: Option<flamia_data::DataState>,
    /// RNG: the run seed; libtorch's generator is re-seeded with `seed + step` on resume (the
    /// training step draws no random numbers, so this reproduces a straight run exactly).
    pub rng_seed: u64,
    /// Recent losses of the spike detector.
    pub recent_losses: Vec<f64>,
    /// Steps skipped so far (non-finite or spiking).
    pub skipped_steps: usize,
    /// Tokens consumed so far.
    pub tokens_seen: u64,
}

fn ckpt_name(step: usize) -> String {
    format!("step_{step:08}")
}

fn cerr(what: &str, path: &Path, e: impl std::fmt::Display) -> TrainError {
    TrainError::Checkpoint(format!("{what} {}: {e}", path.display()))
}

/// Writes a checkpoint atomically and prunes older ones; returns its directory.
pub fn save(
    run_dir: &Path,
    state: &TrainState,
    model: &[(String, Tensor)],
    optimizer: &[(String, Tensor)],
    config_toml: &str,
    keep: usize,
) -> Result<PathBuf> {
    let root = run_dir.join("checkpoints");
    std::fs::create_dir_all(&root).map_err(|e| TrainError::io(&root, e))?;
    let final_dir = root.join(ckpt_name(state.step));
    let tmp = root.join(format!("{}.tmp", ckpt_name(state.step)));
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp).map_err(|e| TrainError::io(&tmp, e))?;
    }
    std::fs::create_dir_all(&tmp).map_err(|e| TrainError::io(&tmp, e))?;
    let to_cpu = |v: &[(String, Tensor)]| -> Vec<(String, Tensor)> {
        v.iter()
            .map(|(n, t)| (n.clone(), t.detach().to_device(tch::Device::Cpu).contiguous()))
            .collect()
    };
    Tensor::write_safetensors(&to_cpu(model), tmp.join("model.safetensors"))
        .map_err(|e| cerr("writing", &tmp.join("model.safetensors"), e))?;
    Tensor::write_safetensors(&to_cpu(optimizer), tmp.join("optimizer.safetensors"))
        .map_err(|e| cerr("writing", &tmp.join("optimizer.safetensors"), e))?;
    let json = serde_json::to_string_pretty(state).map_err(|e| cerr("serialising", &tmp, e))?;
    write_synced(&tmp.join("state.json"), json.as_bytes())?;
    write_synced(&tmp.join("config.toml"), config_toml.as_bytes())?;
    if final_dir.exists() {
        std::fs::remove_dir_all(&final_dir).map_err(|e| TrainError::io(&final_dir, e))?;
    }
    std::fs::rename(&tmp, &final_dir).map_err(|e| TrainError::io(&final_dir, e))?;
    prune(&root, keep)?;
    Ok(final_dir)
}

fn write_synced(path: &Path, bytes: &[u8]) -> Result<()> {
    use std::io::Write;
    let mut f = std::fs::File::create(path).map_err(|e| TrainError::io(path, e))?;
    f.write_all(bytes)
        .and_then(|_| f.sync_all())
        .map_err(|e| TrainError::io(path, e))
}

/// Complete checkpoints under `<run>/checkpoints`, oldest first.
pub fn list(run_dir: &Path) -> Result<Vec<(usize, PathBuf)>> {
    let root = run_dir.join("checkpoints");
    if !root.exists() {
        return Ok(Vec::new());
    }
    let mut out = Vec::new();
    for e in std::fs::read_dir(&root).map_err(|e| TrainError::io(&root, e))? {
        let p = e.map_err(|e| TrainError::io(&root, e))?.path();
        let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if let Some(step) = name.strip_prefix("step_").and_then(|s| s.parse::<usize>().ok()) {
            if p.join("state.json").exists() {
                out.push((step, p));
            }
        }
    }
    out.sort();
    Ok(out)
}

fn prune(root: &Path, keep: usize) -> Result<()> {
    let all = list(root.parent().unwrap_or(root))?;
    for (_, p) in all.iter().take(all.len().saturating_sub(keep)) {
        std::fs::remove_dir_all(p).map_err(|e| TrainError::io(p, e))?;
    }
    Ok(())
}

/// A loaded checkpoint.
#[derive(Debug)]
pub struct Loaded {
    pub dir: PathBuf,
    pub state: TrainState,
    pub model: Vec<(String, Tensor)>,
    pub optimizer: Vec<(String, Tensor)>,
    pub config_toml: String,
}

/// Loads the checkpoint in `dir`.
pub fn load(dir: &Path) -> Result<Loaded> {
    let read =
        |name: &str| std::fs::read_to_string(dir.join(name)).map_err(|e| TrainError::io(dir.join(name), e));
    let state: TrainState = serde_json::from_str(&read("state.json")?)
        .map_err(|e| cerr("parsing", &dir.join("state.json"), e))?;
    let model = Tensor::read_safetensors(dir.join("model.safetensors"))
        .map_err(|e| cerr("reading", &dir.join("model.safetensors"), e))?;
    let optimizer = Tensor::read_safetensors(dir.join("optimizer.safetensors"))
        .map_err(|e| cerr("reading", &dir.join("optimizer.safetensors"), e))?;
    Ok(Loaded {
        dir: dir.to_path_buf(),
        state,
        model,
        optimizer,
        config_toml: read("config.toml")?,
    })
}

/// Copies saved weights into the model's variables (same names and shapes).
pub fn restore_params(params: &[(String, Tensor)], saved: Vec<(String, Tensor)>) -> Result<()> {
    let mut map: std::collections::HashMap<String, Tensor> = saved.into_iter().collect();
    tch::no_grad(|| {
        for (name, p) in params {
            let src = map
                .remove(name)
                .ok_or_else(|| TrainError::Checkpoint(format!("checkpoint lacks parameter {name}")))?;
            if src.size() != p.size() {
                return Err(TrainError::Checkpoint(format!(
                    "parameter {name} has shape {:?} in the checkpoint, the model needs {:?}",
                    src.size(),
                    p.size()
                )));
            }
            p.shallow_clone().copy_(&src);
        }
        if let Some(extra) = map.keys().next() {
            return Err(TrainError::Checkpoint(format!(
                "checkpoint has a parameter the model lacks: {extra}"
            )));
        }
        Ok(())
    })
}
