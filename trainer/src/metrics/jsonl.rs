//! `metrics.jsonl` in the run directory: one JSON object per logged step, appended and flushed.

use std::io::Write;
use std::path::{Path, PathBuf};

use crate::error::{Result, TrainError};

use super::StepMetrics;

/// Appends step records to `<run>/metrics.jsonl`.
#[derive(Debug)]
pub struct JsonlWriter {
    path: PathBuf,
    file: std::fs::File,
}

impl JsonlWriter {
    /// Opens (appending: a resumed run continues the file) `<run_dir>/metrics.jsonl`.
    /// When resuming, lines of steps after `keep_upto` (written after the checkpoint) are dropped.
    pub fn open(run_dir: &Path, keep_upto: Option<usize>) -> Result<JsonlWriter> {
        let path = run_dir.join("metrics.jsonl");
        if let Some(last) = keep_upto {
            if let Ok(text) = std::fs::read_to_string(&path) {
                let kept: String = text
                    .lines()
                    .filter(|l| {
                        serde_json::from_str::<serde_json::Value>(l)
                            .ok()
                            .and_then(|v| v.get("step").and_then(|s| s.as_u64()))
                            .is_some_and(|s| s as usize <= last)
                    })
                    .map(|l| format!("{l}\n"))
                    .collect();
                // (atomically: a kill here must not lose the run's history)
                crate::checkpoint::write_atomic(&path, kept.as_bytes())?;
            }
        } else if path.exists() {
            std::fs::remove_file(&path).map_err(|e| TrainError::io(&path, e))?;
        }
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(|e| TrainError::io(&path, e))?;
        Ok(JsonlWriter { path, file })
    }

    /// Appends one record.
    pub fn write(&mut self, m: &StepMetrics) -> Result<()> {
        let line = serde_json::to_string(m).map_err(|e| TrainError::Invalid(e.to_string()))?;
        writeln!(self.file, "{line}")
            .and_then(|_| self.file.flush())
            .map_err(|e| TrainError::io(&self.path, e))
    }
}
