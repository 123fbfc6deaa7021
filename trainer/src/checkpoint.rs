//! Checkpoints: `<run>/checkpoints/step_NNNNNNNN/` holding `model.safetensors` (f32 master
//! weights), `optimizer.safetensors` (AdamW moments), `state.json` (step, optimizer update count,
//! data state, RNG, loss-spike window), `config.toml` (the resolved config) and, for a
//! data-parallel run, `data_states.json` (every rank's data position).
//!
//! Durability: every file is written into `step_NNNNNNNN.tmp/` and fsynced, then the directory
//! is fsynced, renamed into place, and the parent directory fsynced; so after a crash or power
//! loss a checkpoint under its final name is complete, and an incomplete one is only ever a
//! `.tmp` directory (ignored, removed by the next checkpoint write). The last `keep` are kept;
//! pruning never removes the checkpoint just written or a newer one.
//!
//! Writing in the background: [`Snapshot::take`] copies the tensors to host memory (the only
//! part that must happen between two steps), [`Writer::start`] writes that copy from a thread
//! while training continues; [`Writer::wait`] joins it and reports its error. The writer thread
//! logs a failure as soon as it happens, and a `Writer` dropped on an error path joins its write
//! first, so an error in a later step does not cut the previous checkpoint short.
//!
//! Reading: [`load_newest`] tries the checkpoints newest first and falls back to an older one
//! when one cannot be read (truncated tensor file, unparsable state), saying why.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::thread::JoinHandle;

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

/// Per-rank data states of a data-parallel checkpoint (world size > 1).
pub const DATA_STATES: &str = "data_states.json";

fn ckpt_name(step: usize) -> String {
    format!("step_{step:08}")
}

fn cerr(what: &str, path: &Path, e: impl std::fmt::Display) -> TrainError {
    TrainError::Checkpoint(format!("{what} {}: {e}", path.display()))
}

/// A checkpoint's content in host memory, ready to be written by any thread.
#[derive(Debug)]
pub struct Snapshot {
    step: usize,
    state_json: String,
    config_toml: String,
    model: Vec<(String, Tensor)>,
    optimizer: Vec<(String, Tensor)>,
    /// Further files (name, bytes), e.g. [`DATA_STATES`].
    extra: Vec<(String, Vec<u8>)>,
}

/// A contiguous host copy of `t` (a copy also when `t` already lives on the CPU: training goes
/// on updating the original in place while the copy is written).
fn host_copy(t: &Tensor) -> Result<Tensor> {
    let t = t.f_detach()?;
    let mut dst = Tensor::f_empty(t.size().as_slice(), (t.kind(), tch::Device::Cpu))?;
    dst.f_copy_(&t)?;
    Ok(dst)
}

impl Snapshot {
    /// Copies the tensors off the device (this waits for the device) and serialises the state.
    pub fn take(
        state: &TrainState,
        model: &[(String, Tensor)],
        optimizer: &[(String, Tensor)],
        config_toml: &str,
        extra: Vec<(String, Vec<u8>)>,
    ) -> Result<Snapshot> {
        let copy = |v: &[(String, Tensor)]| -> Result<Vec<(String, Tensor)>> {
            v.iter().map(|(n, t)| Ok((n.clone(), host_copy(t)?))).collect()
        };
        Ok(Snapshot {
            step: state.step,
            state_json: serde_json::to_string_pretty(state)
                .map_err(|e| TrainError::Checkpoint(format!("serialising the train state: {e}")))?,
            config_toml: config_toml.to_string(),
            model: copy(model)?,
            optimizer: copy(optimizer)?,
            extra,
        })
    }

    /// The step this snapshot belongs to.
    pub fn step(&self) -> usize {
        self.step
    }

    /// Writes the checkpoint durably (module docs) and prunes older ones; returns its directory.
    /// A write that fails removes what it wrote (its `.tmp`), so that a full disk does not fill
    /// further with every later attempt.
    pub fn write(&self, run_dir: &Path, keep: usize) -> Result<PathBuf> {
        let root = run_dir.join("checkpoints");
        if !root.exists() {
            std::fs::create_dir_all(&root).map_err(|e| TrainError::io(&root, e))?;
            sync_dir(run_dir)?; // (the new `checkpoints` entry itself)
        }
        // (one writer at a time: any `.tmp` here is a killed or failed write's)
        remove_partial(run_dir)?;
        let final_dir = root.join(ckpt_name(self.step));
        let tmp = root.join(format!("{}.tmp", ckpt_name(self.step)));
        if let Err(e) = self.write_files(&tmp) {
            let _ = std::fs::remove_dir_all(&tmp);
            return Err(e);
        }
        if final_dir.exists() {
            std::fs::remove_dir_all(&final_dir).map_err(|e| TrainError::io(&final_dir, e))?;
        }
        std::fs::rename(&tmp, &final_dir).map_err(|e| TrainError::io(&final_dir, e))?;
        sync_dir(&root)?;
        prune(run_dir, keep, self.step)?;
        Ok(final_dir)
    }

    /// Every file of the checkpoint into `tmp`, each fsynced, then `tmp` itself.
    fn write_files(&self, tmp: &Path) -> Result<()> {
        std::fs::create_dir_all(tmp).map_err(|e| TrainError::io(tmp, e))?;
        for (name, tensors) in [
            ("model.safetensors", &self.model),
            ("optimizer.safetensors", &self.optimizer),
        ] {
            let path = tmp.join(name);
            Tensor::write_safetensors(tensors, &path).map_err(|e| cerr("writing", &path, e))?;
            sync_file(&path)?;
        }
        write_synced(&tmp.join("state.json"), self.state_json.as_bytes())?;
        write_synced(&tmp.join("config.toml"), self.config_toml.as_bytes())?;
        for (name, bytes) in &self.extra {
            write_synced(&tmp.join(name), bytes)?;
        }
        sync_dir(tmp)
    }
}

/// At most one checkpoint being written in the background.
#[derive(Debug, Default)]
pub struct Writer {
    pending: Option<(usize, JoinHandle<Result<PathBuf>>)>,
}

impl Writer {
    /// Waits for the previous write (its error, if any, is returned before anything starts),
    /// then writes `snap` from a new thread.
    pub fn start(&mut self, snap: Snapshot, run_dir: &Path, keep: usize) -> Result<()> {
        self.wait()?;
        let step = snap.step();
        let run_dir = run_dir.to_path_buf();
        let handle = std::thread::Builder::new()
            .name("flamia-checkpoint".into())
            .spawn(move || {
                let r = snap.write(&run_dir, keep);
                if let Err(e) = &r {
                    // now, not only when the next checkpoint joins this thread
                    tracing::error!("the checkpoint of step {step} was not written: {e}");
                }
                r
            })
            .map_err(|e| TrainError::Checkpoint(format!("cannot start the checkpoint writer: {e}")))?;
        self.pending = Some((step, handle));
        Ok(())
    }

    /// Waits for the write in progress, if any; its directory, or its error.
    pub fn wait(&mut self) -> Result<Option<PathBuf>> {
        let Some((step, handle)) = self.pending.take() else {
            return Ok(None);
        };
        match handle.join() {
            Ok(r) => r.map(Some),
            Err(_) => Err(TrainError::Checkpoint(format!(
                "the background writer of step {step} panicked"
            ))),
        }
    }
}

impl Drop for Writer {
    /// A run that ends on an error still completes the checkpoint being written (the process
    /// exits after this, which would otherwise kill the thread mid-write).
    fn drop(&mut self) {
        if let Some((step, _)) = &self.pending {
            let step = *step;
            match self.wait() {
                Ok(Some(dir)) => tracing::info!("checkpoint {} written before exiting", dir.display()),
                Ok(None) => {}
                Err(e) => tracing::error!("the checkpoint of step {step} was not written: {e}"),
            }
        }
    }
}

/// Replaces `path` with `bytes` so that a crash leaves either the old file or the new one, never
/// a truncated one (`flamia_data::atomic::write`: `path.tmp`, fsynced, renamed over `path`, the
/// directory fsynced; a failed write removes `path.tmp`).
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    flamia_data::atomic::write(path, bytes).map_err(|e| match e {
        flamia_data::DataError::Write { problem, .. } => TrainError::io(path, std::io::Error::other(problem)),
        other => TrainError::io(path, std::io::Error::other(other.to_string())),
    })
}

fn write_synced(path: &Path, bytes: &[u8]) -> Result<()> {
    let mut f = std::fs::File::create(path).map_err(|e| TrainError::io(path, e))?;
    f.write_all(bytes)
        .and_then(|_| f.sync_all())
        .map_err(|e| TrainError::io(path, e))
}

fn sync_file(path: &Path) -> Result<()> {
    std::fs::File::open(path)
        .and_then(|f| f.sync_all())
        .map_err(|e| TrainError::io(path, e))
}

/// fsync of a directory: makes the entries created or renamed in it durable.
fn sync_dir(dir: &Path) -> Result<()> {
    std::fs::File::open(dir)
        .and_then(|f| f.sync_all())
        .map_err(|e| TrainError::io(dir, e))
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

/// Removes all but the newest `keep` checkpoints up to `written` (the one just written), never
/// `written` itself or a newer one, and any `step_*.tmp` left by a write that was killed (one
/// writer at a time: none is in progress when this runs).
fn prune(run_dir: &Path, keep: usize, written: usize) -> Result<()> {
    let upto: Vec<_> = list(run_dir)?
        .into_iter()
        .filter(|(s, _)| *s <= written)
        .collect();
    for (_, p) in upto.iter().take(upto.len().saturating_sub(keep.max(1))) {
        std::fs::remove_dir_all(p).map_err(|e| TrainError::io(p, e))?;
    }
    remove_partial(run_dir)
}

/// Removes the `step_*.tmp` directories of writes that never completed.
fn remove_partial(run_dir: &Path) -> Result<()> {
    let root = run_dir.join("checkpoints");
    if !root.exists() {
        return Ok(());
    }
    for e in std::fs::read_dir(&root).map_err(|e| TrainError::io(&root, e))? {
        let p = e.map_err(|e| TrainError::io(&root, e))?.path();
        let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if name.starts_with("step_") && name.ends_with(".tmp") && p.is_dir() {
            tracing::info!(
                "removing {}, left by a checkpoint write that did not complete",
                p.display()
            );
            std::fs::remove_dir_all(&p).map_err(|e| TrainError::io(&p, e))?;
        }
    }
    Ok(())
}

/// Removes every checkpoint of `run_dir` (complete or partial): a fresh run started with
/// `--overwrite` in a directory that holds an earlier run's. Returns how many complete ones went.
pub fn remove_all(run_dir: &Path) -> Result<usize> {
    let all = list(run_dir)?;
    for (_, p) in &all {
        std::fs::remove_dir_all(p).map_err(|e| TrainError::io(p, e))?;
    }
    remove_partial(run_dir)?;
    Ok(all.len())
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

/// The newest checkpoint of `run_dir` that loads and passes `accept` (e.g. has the data states a
/// data-parallel resume needs), trying older ones when the newest cannot be used; each one
/// skipped is logged with its reason. `None` when there is no checkpoint at all; an error when
/// there are checkpoints but none is usable (resuming silently from scratch would throw the run
/// away).
pub fn load_newest(run_dir: &Path, accept: impl Fn(&Loaded) -> Result<()>) -> Result<Option<Loaded>> {
    let all = list(run_dir)?;
    let mut reasons = Vec::new();
    for (_, dir) in all.iter().rev() {
        match load(dir).and_then(|l| accept(&l).map(|_| l)) {
            Ok(l) => {
                if !reasons.is_empty() {
                    tracing::warn!(
                        "resuming from the older checkpoint {} ({} newer one(s) unusable)",
                        dir.display(),
                        reasons.len()
                    );
                }
                return Ok(Some(l));
            }
            Err(e) => {
                tracing::warn!(
                    "checkpoint {} is unusable, trying an older one: {e}",
                    dir.display()
                );
                reasons.push(e.to_string());
            }
        }
    }
    if reasons.is_empty() {
        Ok(None)
    } else {
        Err(TrainError::Checkpoint(format!(
            "no usable checkpoint in {}: {}",
            run_dir.join("checkpoints").display(),
            reasons.join("; ")
        )))
    }
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
            p.shallow_clone().f_copy_(&src)?;
        }
        if let Some(extra) = map.keys().next() {
            return Err(TrainError::Checkpoint(format!(
                "checkpoint has a parameter the model lacks: {extra}"
            )));
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(step: usize) -> TrainState {
        TrainState {
            step,
            optimizer_updates: step as u64,
            data: None,
            rng_seed: 0,
            recent_losses: Vec::new(),
            skipped_steps: 0,
            tokens_seen: 0,
        }
    }

    #[test]
    fn background_writes_are_complete_and_an_unreadable_newest_falls_back_to_an_older_one() {
        let tmp = tempfile::tempdir().unwrap();
        let run = tmp.path();
        let w = Tensor::from_slice(&[1.0f32, 2.0, 3.0]);
        let params = vec![("w".to_string(), w.shallow_clone())];
        let mut writer = Writer::default();
        for step in [5, 10] {
            let extra = vec![(DATA_STATES.to_string(), b"[]".to_vec())];
            let snap = Snapshot::take(&state(step), &params, &params, "x = 1\n", extra).unwrap();
            // The snapshot is a copy: training may change the weights while it is written.
            let _ = tch::no_grad(|| params[0].1.shallow_clone().f_add_scalar_(1.0)).unwrap();
            writer.start(snap, run, 3).unwrap();
        }
        let dir = writer.wait().unwrap().unwrap();
        assert!(dir.ends_with("step_00000010") && dir.join(DATA_STATES).is_file());
        let l = load(&dir).unwrap();
        let saved: Vec<f32> = Vec::try_from(&l.model[0].1).unwrap();
        assert_eq!(
            saved,
            vec![2.0, 3.0, 4.0],
            "the values at the time of the snapshot"
        );
        assert_eq!(list(run).unwrap().len(), 2);

        // A truncated tensor file in the newest: the older one is used, and said so.
        let f = dir.join("model.safetensors");
        let len = std::fs::metadata(&f).unwrap().len();
        std::fs::OpenOptions::new()
            .write(true)
            .open(&f)
            .unwrap()
            .set_len(len / 2)
            .unwrap();
        let l = load_newest(run, |_| Ok(())).unwrap().unwrap();
        assert_eq!(l.state.step, 5);
        // `accept` can refuse one too (e.g. data states for another world size).
        let none = load_newest(run, |l| {
            Err(TrainError::Checkpoint(format!("refused {}", l.state.step)))
        })
        .unwrap_err();
        assert!(none.to_string().contains("no usable checkpoint"), "{none}");
        assert!(load_newest(&run.join("nothing"), |_| Ok(())).unwrap().is_none());
    }

    /// A fake complete checkpoint of `step` (what `list` counts).
    fn fake(run: &Path, step: usize) {
        let d = run.join("checkpoints").join(ckpt_name(step));
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("state.json"), "{}").unwrap();
    }

    #[test]
    fn pruning_keeps_the_checkpoint_just_written_and_newer_ones_and_removes_partial_writes() {
        let tmp = tempfile::tempdir().unwrap();
        let run = tmp.path();
        let params = vec![("w".to_string(), Tensor::from_slice(&[1.0f32]))];
        let write = |step| {
            Snapshot::take(&state(step), &params, &params, "", Vec::new())
                .unwrap()
                .write(run, 2)
                .unwrap()
        };
        for s in [900, 1000] {
            fake(run, s);
        }
        std::fs::create_dir_all(run.join("checkpoints/step_00000950.tmp")).unwrap();
        // Older than both: it survives its own pruning, and so do the newer two.
        write(100);
        let steps = || list(run).unwrap().into_iter().map(|(s, _)| s).collect::<Vec<_>>();
        assert_eq!(steps(), vec![100, 900, 1000]);
        assert!(
            !run.join("checkpoints/step_00000950.tmp").exists(),
            "a killed write's .tmp is removed"
        );
        write(200);
        write(300);
        assert_eq!(
            steps(),
            vec![200, 300, 900, 1000],
            "keep 2 among those up to the one written"
        );
        assert_eq!(remove_all(run).unwrap(), 4);
        assert!(steps().is_empty());
    }

    #[test]
    fn a_dropped_writer_completes_its_write_and_a_failed_one_is_reported_by_wait() {
        let tmp = tempfile::tempdir().unwrap();
        let params = vec![("w".to_string(), Tensor::from_slice(&[1.0f32; 1 << 16]))];
        let snap = || Snapshot::take(&state(7), &params, &params, "", Vec::new()).unwrap();
        let mut w = Writer::default();
        w.start(snap(), tmp.path(), 2).unwrap();
        drop(w); // (as on an error path of the training loop)
        let l = load(&tmp.path().join("checkpoints/step_00000007")).unwrap();
        assert_eq!(l.state.step, 7);
        // A run directory that cannot hold a `checkpoints` directory: the error comes back.
        let file = tmp.path().join("not-a-dir");
        std::fs::write(&file, "").unwrap();
        let mut w = Writer::default();
        w.start(snap(), &file, 2).unwrap();
        assert!(w.wait().is_err());
        assert!(w.wait().unwrap().is_none(), "reported once");
    }

    #[test]
    fn a_failed_write_removes_what_it_wrote() {
        let tmp = tempfile::tempdir().unwrap();
        let params = vec![("w".to_string(), Tensor::from_slice(&[1.0f32]))];
        // An extra file the write cannot create (its directory does not exist): the model and
        // optimizer files were written first.
        let extra = vec![("no/such/dir".to_string(), b"x".to_vec())];
        let snap = Snapshot::take(&state(3), &params, &params, "", extra).unwrap();
        assert!(snap.write(tmp.path(), 2).is_err());
        let left: Vec<_> = std::fs::read_dir(tmp.path().join("checkpoints"))
            .unwrap()
            .collect();
        assert!(left.is_empty(), "{left:?}");
    }

    #[test]
    fn atomic_writes_replace_the_file_and_leave_no_temporary() {
        let tmp = tempfile::tempdir().unwrap();
        let f = tmp.path().join("metrics.jsonl");
        std::fs::write(&f, "old\n").unwrap();
        write_atomic(&f, b"new\n").unwrap();
        assert_eq!(std::fs::read_to_string(&f).unwrap(), "new\n");
        assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 1);
    }
}
