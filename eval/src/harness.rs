//! The task harness: turns records into docs, scores every choice through a [`Scorer`] in batches,
//! and computes `acc` (argmax of log-likelihood) and `acc_norm` (argmax of log-likelihood divided
//! by the choice's length in characters), with bootstrap intervals and the per-example outcomes
//! that paired comparisons need.

use crate::error::{Error, Result};
use crate::results::TaskResult;
use crate::scorer::{Request, Scorer};
use crate::stats::{bootstrap_mean, RESAMPLES, SEED};
use crate::tasks::{Doc, Task};
use serde_json::Value;

/// Harness options.
#[derive(Debug, Clone, Copy)]
pub struct HarnessOptions {
    /// Requests per [`Scorer::loglikelihood`] call (at least 1).
    pub batch_size: usize,
    /// Score only the first `limit` examples of each task.
    pub limit: Option<usize>,
}

impl Default for HarnessOptions {
    fn default() -> Self {
        HarnessOptions {
            batch_size: 32,
            limit: None,
        }
    }
}

/// Outcome of one doc.
#[derive(Debug, Clone, PartialEq)]
pub struct DocScore {
    /// Log-likelihood of each choice.
    pub lls: Vec<f64>,
    /// Argmax of `lls` (first on ties, like numpy).
    pub pred: usize,
    /// Argmax of `lls[i] / norm_lens[i]`.
    pub pred_norm: usize,
    pub gold: usize,
}

/// Scores every choice of every doc, `batch_size` requests per scorer call.
pub fn score_docs(scorer: &mut dyn Scorer, docs: &[Doc], batch_size: usize) -> Result<Vec<DocScore>> {
    let requests: Vec<&Request> = docs.iter().flat_map(|d| &d.requests).collect();
    let mut lls = Vec::with_capacity(requests.len());
    for chunk in requests.chunks(batch_size.max(1)) {
        let batch: Vec<Request> = chunk.iter().map(|r| (*r).clone()).collect();
        let got = scorer.loglikelihood(&batch)?;
        if got.len() != batch.len() {
            return Err(Error::Scorer(format!(
                "returned {} results for {} requests",
                got.len(),
                batch.len()
            )));
        }
        lls.extend(got.into_iter().map(|l| l.logprob));
    }
    let mut at = 0;
    Ok(docs
        .iter()
        .map(|d| {
            let l = lls[at..at + d.requests.len()].to_vec();
            at += d.requests.len();
            let normed: Vec<f64> = l
                .iter()
                .zip(&d.norm_lens)
                .map(|(x, &n)| x / n.max(1) as f64)
                .collect();
            DocScore {
                pred: argmax(&l),
                pred_norm: argmax(&normed),
                lls: l,
                gold: d.gold,
            }
        })
        .collect())
}

/// First index of the maximum (NaN never wins).
fn argmax(xs: &[f64]) -> usize {
    let mut best = 0;
    for (i, &x) in xs.iter().enumerate() {
        if x > xs[best] || xs[best].is_nan() && !x.is_nan() {
            best = i;
        }
    }
    best
}

/// Converts records into docs (record errors name the task and record index).
pub fn docs_of(task: Task, records: &[Value]) -> Result<Vec<Doc>> {
    records.iter().enumerate().map(|(i, r)| task.doc(r, i)).collect()
}

/// Evaluates `task` on `records` (already limited) and summarises it.
pub fn evaluate(
    scorer: &mut dyn Scorer,
    task: Task,
    records: &[Value],
    opts: &HarnessOptions,
) -> Result<TaskResult> {
    let records = &records[..opts.limit.map_or(records.len(), |l| l.min(records.len()))];
    let docs = docs_of(task, records)?;
    if docs.is_empty() {
        return Err(Error::Invalid(format!("task {task} has no examples to score")));
    }
    let scores = score_docs(scorer, &docs, opts.batch_size)?;
    Ok(summarise(task, &docs, &scores))
}

/// Accuracies, intervals, per-example outcomes and the examples' fingerprint.
pub fn summarise(task: Task, docs: &[Doc], scores: &[DocScore]) -> TaskResult {
    let correct: Vec<f64> = scores.iter().map(|s| f64::from(s.pred == s.gold)).collect();
    let correct_norm: Vec<f64> = scores.iter().map(|s| f64::from(s.pred_norm == s.gold)).collect();
    let acc = bootstrap_mean(&correct, RESAMPLES, SEED);
    let acc_norm = bootstrap_mean(&correct_norm, RESAMPLES, SEED);
    TaskResult {
        task: task.name().to_string(),
        split: task.split().to_string(),
        files: Vec::new(),
        n: docs.len(),
        acc: acc.mean,
        acc_ci95: [acc.lo, acc.hi],
        acc_norm: acc_norm.mean,
        acc_norm_ci95: [acc_norm.lo, acc_norm.hi],
        fingerprint: fingerprint(docs),
        correct: bits(&correct),
        correct_norm: bits(&correct_norm),
    }
}

fn bits(xs: &[f64]) -> String {
    xs.iter().map(|&x| if x > 0.5 { '1' } else { '0' }).collect()
}

/// FNV-1a 64 over every request and gold index: two results with the same fingerprint scored the
/// same examples in the same order, so they can be compared pairwise.
pub fn fingerprint(docs: &[Doc]) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |bytes: &[u8]| {
        for &b in bytes {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    };
    for d in docs {
        for r in &d.requests {
            eat(r.context.as_bytes());
            eat(&[0]);
            eat(r.continuation.as_bytes());
            eat(&[1]);
        }
        eat(&(d.gold as u64).to_le_bytes());
    }
    format!("{h:016x}")
}

#[cfg(test)]
mod tests {
    use super::argmax;

    #[test]
    fn argmax_takes_first_max_and_skips_nan() {
        assert_eq!(argmax(&[1.0, 3.0, 3.0]), 1);
        assert_eq!(argmax(&[f64::NAN, -5.0]), 1);
    }
}
