//! The task harness: turns records into docs (optionally preceded by few-shot examples), scores
//! every choice through a [`Scorer`] in batches, and computes `acc` (argmax of log-likelihood) and
//! `acc_norm` (argmax of log-likelihood divided by the choice's length in characters) — or, for
//! LAMBADA, greedy accuracy and perplexity — with bootstrap intervals and the per-example outcomes
//! that paired comparisons need.

use crate::error::{Error, Result};
use crate::results::TaskResult;
use crate::scorer::{Request, Scorer};
use crate::stats::{bootstrap_mean, RESAMPLES, SEED};
use crate::tasks::{Doc, Kind, Task};
use rand::seq::index::sample;
use rand::SeedableRng;
use serde_json::Value;

/// lm-evaluation-harness's default separator between few-shot examples.
pub const FEWSHOT_DELIMITER: &str = "\n\n";
/// Seed of the few-shot example choice (lm-evaluation-harness's default `fewshot_seed`).
pub const FEWSHOT_SEED: u64 = 1234;

/// Harness options.
#[derive(Debug, Clone)]
pub struct HarnessOptions {
    /// Requests per [`Scorer::loglikelihood`] call (at least 1).
    pub batch_size: usize,
    /// Score only the first `limit` examples of each task.
    pub limit: Option<usize>,
    /// Solved examples put before each scored one (0 = zero-shot).
    pub num_fewshot: usize,
    /// Text between few-shot examples and before the scored one.
    pub fewshot_delimiter: String,
}

impl Default for HarnessOptions {
    fn default() -> Self {
        HarnessOptions {
            batch_size: 32,
            limit: None,
            num_fewshot: 0,
            fewshot_delimiter: FEWSHOT_DELIMITER.into(),
        }
    }
}

/// Prepends `k` solved examples to every request of each of the first `n` docs: for doc `i`, `k`
/// distinct other docs of the pool chosen by ChaCha8(`FEWSHOT_SEED`, `i`), each as its gold
/// context + continuation ([`Doc::solved`], without the task description), joined and followed
/// by `delimiter`. As in lm-evaluation-harness, doc `i`'s [`Doc::description`] (MMLU's subject
/// line) comes once, first: `description + example + delimiter + ... + question`. With `k = 0`
/// the docs are returned unchanged. lm-evaluation-harness draws the examples from the task's
/// training split; the pool here is the scored split itself (the doc excluded).
pub fn with_fewshot(docs: &[Doc], n: usize, k: usize, delimiter: &str) -> Result<Vec<Doc>> {
    let n = n.min(docs.len());
    if k == 0 {
        return Ok(docs[..n].to_vec());
    }
    if k >= docs.len() {
        return Err(Error::Invalid(format!(
            "{k} few-shot examples need more than {} examples in the task",
            docs.len()
        )));
    }
    Ok((0..n)
        .map(|i| {
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(FEWSHOT_SEED ^ (i as u64).rotate_left(32));
            let picks: Vec<usize> = sample(&mut rng, docs.len() - 1, k)
                .into_iter()
                .map(|j| if j >= i { j + 1 } else { j })
                .collect();
            let mut prefix = docs[i].description.clone();
            for j in picks {
                prefix.push_str(&docs[j].solved());
                prefix.push_str(delimiter);
            }
            let mut d = docs[i].clone();
            for r in &mut d.requests {
                r.context = format!("{prefix}{}", docs[i].question(r));
            }
            d
        })
        .collect())
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
    /// Whether each choice's continuation was entirely the model's greedy prediction.
    pub greedy: Vec<bool>,
}

/// Scores every choice of every doc, `batch_size` requests per scorer call.
pub fn score_docs(scorer: &mut dyn Scorer, docs: &[Doc], batch_size: usize) -> Result<Vec<DocScore>> {
    let requests: Vec<&Request> = docs.iter().flat_map(|d| &d.requests).collect();
    let mut lls = Vec::with_capacity(requests.len());
    let mut greedy = Vec::with_capacity(requests.len());
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
        for l in got {
            lls.push(l.logprob);
            greedy.push(l.greedy);
        }
    }
    let mut at = 0;
    Ok(docs
        .iter()
        .map(|d| {
            let l = lls[at..at + d.requests.len()].to_vec();
            let g = greedy[at..at + d.requests.len()].to_vec();
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
                greedy: g,
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
    let n = opts.limit.map_or(records.len(), |l| l.min(records.len()));
    // Few-shot examples come from every record, not only the scored ones.
    let pool = if opts.num_fewshot > 0 {
        records
    } else {
        &records[..n]
    };
    let docs = with_fewshot(
        &docs_of(task, pool)?,
        n,
        opts.num_fewshot,
        &opts.fewshot_delimiter,
    )?;
    if docs.is_empty() {
        return Err(Error::Invalid(format!("task {task} has no examples to score")));
    }
    let scores = score_docs(scorer, &docs, opts.batch_size)?;
    let mut r = summarise(task, &docs, &scores);
    r.num_fewshot = opts.num_fewshot;
    Ok(r)
}

/// Accuracies, intervals, per-example outcomes and the examples' fingerprint. For a
/// [`Kind::LastWord`] task `acc` (and `acc_norm`) is the greedy accuracy and `perplexity` is set.
pub fn summarise(task: Task, docs: &[Doc], scores: &[DocScore]) -> TaskResult {
    let last_word = task.kind() == Kind::LastWord;
    let correct: Vec<f64> = scores
        .iter()
        .map(|s| {
            f64::from(if last_word {
                s.greedy[s.gold]
            } else {
                s.pred == s.gold
            })
        })
        .collect();
    let correct_norm: Vec<f64> = if last_word {
        correct.clone()
    } else {
        scores.iter().map(|s| f64::from(s.pred_norm == s.gold)).collect()
    };
    let perplexity = last_word.then(|| {
        let mean = scores.iter().map(|s| s.lls[s.gold]).sum::<f64>() / scores.len().max(1) as f64;
        (-mean).exp()
    });
    let acc = bootstrap_mean(&correct, RESAMPLES, SEED);
    let acc_norm = bootstrap_mean(&correct_norm, RESAMPLES, SEED);
    TaskResult {
        perplexity,
        num_fewshot: 0,
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
