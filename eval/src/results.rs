//! The result file `flamia eval` writes into a run directory (`eval.json`, schema
//! [`SCHEMA`]) and reads back for comparisons. docs/eval.md documents every field.

use crate::error::{Error, Result};
use crate::validation::ValidationReport;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;

/// Schema tag of [`EvalResults`].
pub const SCHEMA: &str = "flamia-eval/1";
/// File name of the result file inside a run directory.
pub const FILE_NAME: &str = "eval.json";

/// One task's outcome.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskResult {
    pub task: String,
    /// Dataset split scored (`validation` or `test`).
    pub split: String,
    /// Files the records came from.
    pub files: Vec<String>,
    /// Examples scored.
    pub n: usize,
    pub acc: f64,
    /// 95% bootstrap interval of `acc`.
    pub acc_ci95: [f64; 2],
    pub acc_norm: f64,
    pub acc_norm_ci95: [f64; 2],
    /// Hash of the examples (see [`crate::harness::fingerprint`]); paired comparisons require equal
    /// fingerprints.
    pub fingerprint: String,
    /// Per-example outcome of `acc`, one `0`/`1` character per example, in record order.
    pub correct: String,
    /// Per-example outcome of `acc_norm`.
    pub correct_norm: String,
    /// LAMBADA: exp(-mean log-likelihood of the last word) over the examples; absent for
    /// multiple-choice tasks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub perplexity: Option<f64>,
    /// Solved examples before each scored one (0 = zero-shot).
    #[serde(default)]
    pub num_fewshot: usize,
}

impl TaskResult {
    /// Per-example outcomes as 0.0 / 1.0 (`norm` selects `acc_norm`).
    pub fn outcomes(&self, norm: bool) -> Vec<f64> {
        let s = if norm { &self.correct_norm } else { &self.correct };
        s.chars().map(|c| f64::from(c == '1')).collect()
    }
}

/// Everything one `flamia eval` run measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EvalResults {
    /// Always [`SCHEMA`].
    pub schema: String,
    /// Checkpoint directory evaluated.
    pub checkpoint: String,
    /// Optimizer step of the checkpoint, when known.
    pub step: Option<u64>,
    /// Attention path the model was trained with (`bf16`, `mxfp8`, ...).
    pub train_attn: String,
    /// Attention the tasks were scored through (`exact` unless asked otherwise).
    pub task_attn: String,
    /// Seconds since the Unix epoch when the file was written.
    pub created_unix: u64,
    /// Task name -> result.
    pub tasks: BTreeMap<String, TaskResult>,
    /// Validation loss / bits per byte through both attention paths, when a held-out shard was
    /// given.
    pub validation: Option<ValidationReport>,
}

impl EvalResults {
    /// Writes the results as pretty JSON (temporary file + rename, so readers never see half a file).
    pub fn write(&self, path: &Path) -> Result<()> {
        let json = serde_json::to_string_pretty(self)
            .map_err(|e| Error::Invalid(format!("cannot serialise results: {e}")))?;
        let tmp = path.with_extension("json.tmp");
        std::fs::write(&tmp, json + "\n").map_err(|e| Error::io(&tmp, e))?;
        std::fs::rename(&tmp, path).map_err(|e| Error::io(path, e))
    }

    /// Reads a result file and checks its schema tag.
    pub fn read(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        let r: EvalResults = serde_json::from_str(&text).map_err(|e| Error::Json {
            path: path.into(),
            line: e.line(),
            msg: e.to_string(),
        })?;
        if r.schema != SCHEMA {
            return Err(Error::Invalid(format!(
                "{}: schema {:?}, this build reads {SCHEMA:?}",
                path.display(),
                r.schema
            )));
        }
        Ok(r)
    }
}
