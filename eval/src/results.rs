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

/// What [`EvalResults::keep_earlier`] took over from an earlier result file, and what it dropped.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Kept {
    /// Earlier tasks kept (not re-scored this time).
    pub tasks: Vec<String>,
    /// Whether the earlier validation was kept (none scored this time).
    pub validation: bool,
    /// Earlier tasks dropped: scored through another `task_attn` than this time's tasks (the file
    /// records one `task_attn` for all of them).
    pub dropped_tasks: Vec<String>,
}

impl EvalResults {
    /// Takes over from `earlier`, a result file of the same checkpoint, what this evaluation did
    /// not re-score: each earlier task absent from `self.tasks`, and the earlier validation when
    /// `self.validation` is `None`; what was re-scored is this evaluation's. Earlier tasks scored
    /// through another attention than `self.task_attn` are dropped when this evaluation scored
    /// tasks itself; when it scored none, the earlier tasks are kept with their `task_attn`.
    pub fn keep_earlier(&mut self, earlier: EvalResults) -> Kept {
        let mut kept = Kept::default();
        let same_attn = earlier.task_attn == self.task_attn;
        if self.tasks.is_empty() && !earlier.tasks.is_empty() {
            self.task_attn = earlier.task_attn.clone();
        }
        let keep_tasks = same_attn || self.tasks.is_empty();
        for (name, r) in earlier.tasks {
            if self.tasks.contains_key(&name) {
                continue;
            }
            if keep_tasks {
                kept.tasks.push(name.clone());
                self.tasks.insert(name, r);
            } else {
                kept.dropped_tasks.push(name);
            }
        }
        if self.validation.is_none() && earlier.validation.is_some() {
            self.validation = earlier.validation;
            kept.validation = true;
        }
        kept
    }

    /// Writes the results as pretty JSON: a temporary file beside `path`, flushed to disk, renamed
    /// over `path`, then the directory flushed, so readers never see half a file and a crash
    /// leaves either the old file or the new one.
    pub fn write(&self, path: &Path) -> Result<()> {
        use std::io::Write;
        let json = serde_json::to_string_pretty(self)
            .map_err(|e| Error::Invalid(format!("cannot serialise results: {e}")))?;
        let tmp = path.with_extension("json.tmp");
        let mut f = std::fs::File::create(&tmp).map_err(|e| Error::io(&tmp, e))?;
        f.write_all(json.as_bytes())
            .and_then(|()| f.write_all(b"\n"))
            .and_then(|()| f.sync_all())
            .map_err(|e| Error::io(&tmp, e))?;
        drop(f);
        std::fs::rename(&tmp, path).map_err(|e| Error::io(path, e))?;
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        std::fs::File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| Error::io(dir, e))
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::validation::ValStats;

    fn task(name: &str, n: usize) -> TaskResult {
        TaskResult {
            task: name.into(),
            split: "validation".into(),
            files: vec![format!("{name}.jsonl")],
            n,
            acc: 0.5,
            acc_ci95: [0.0, 1.0],
            acc_norm: 0.5,
            acc_norm_ci95: [0.0, 1.0],
            fingerprint: "0".into(),
            correct: "1".repeat(n),
            correct_norm: "0".repeat(n),
            perplexity: None,
            num_fewshot: 0,
        }
    }

    fn val(loss: f64) -> ValidationReport {
        let s = |attn: &str| ValStats {
            attn: attn.into(),
            loss,
            bpb: loss,
            tokens: 10,
            bytes: 10,
            docs: 1,
        };
        ValidationReport {
            source: "held.jsonl".into(),
            seq_len: 64,
            prefix_token: Some(1),
            training: s("training"),
            exact: s("exact"),
            gap_loss: 0.0,
            gap_bpb: 0.0,
        }
    }

    fn results(task_attn: &str, tasks: &[(&str, usize)], v: Option<f64>) -> EvalResults {
        EvalResults {
            schema: SCHEMA.into(),
            checkpoint: "/run/checkpoints/step_00000008".into(),
            step: Some(8),
            train_attn: "mxfp8".into(),
            task_attn: task_attn.into(),
            created_unix: 1,
            tasks: tasks.iter().map(|&(t, n)| (t.to_string(), task(t, n))).collect(),
            validation: v.map(val),
        }
    }

    #[test]
    fn keep_earlier_keeps_what_was_not_rescored_and_replaces_the_rest() {
        let mut now = results("exact", &[("piqa", 1)], None);
        let kept = now.keep_earlier(results("exact", &[("piqa", 5), ("boolq", 3)], Some(2.5)));
        assert_eq!(
            kept,
            Kept {
                tasks: vec!["boolq".into()],
                validation: true,
                dropped_tasks: vec![],
            }
        );
        assert_eq!(now.tasks["piqa"].n, 1, "a re-scored task is this evaluation's");
        assert_eq!(now.tasks["boolq"].n, 3);
        assert_eq!(now.validation, Some(val(2.5)));

        // Validation scored now replaces the earlier one; no earlier task: nothing kept.
        let mut now = results("exact", &[], Some(1.0));
        let kept = now.keep_earlier(results("exact", &[], Some(2.5)));
        assert_eq!(kept, Kept::default());
        assert_eq!(now.validation, Some(val(1.0)));
    }

    #[test]
    fn keep_earlier_drops_tasks_scored_through_another_attention() {
        let mut now = results("training", &[("piqa", 1)], None);
        let kept = now.keep_earlier(results("exact", &[("boolq", 3)], Some(2.5)));
        assert_eq!(kept.dropped_tasks, vec!["boolq".to_string()]);
        assert!(kept.tasks.is_empty() && kept.validation);
        assert_eq!(now.task_attn, "training");
        assert_eq!(now.tasks.len(), 1);

        // Only validation now: the earlier tasks stay, with the attention they were scored through.
        let mut now = results("training", &[], Some(1.0));
        let kept = now.keep_earlier(results("exact", &[("boolq", 3)], None));
        assert_eq!(kept.tasks, vec!["boolq".to_string()]);
        assert_eq!(now.task_attn, "exact");
    }

    #[test]
    fn write_replaces_the_file_and_reads_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(FILE_NAME);
        results("exact", &[("piqa", 2)], Some(2.0)).write(&path).unwrap();
        let r = results("exact", &[("boolq", 3)], None);
        r.write(&path).unwrap();
        assert_eq!(EvalResults::read(&path).unwrap(), r);
        assert!(!path.with_extension("json.tmp").exists());
    }
}
