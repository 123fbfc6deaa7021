//! The scoring interface between the eval crate and a model.
//!
//! Two levels:
//! - [`Scorer`]: string level, "log-likelihood of `continuation` given `context`", batched. The task
//!   harness only needs this; tests implement it with planted values.
//! - [`LanguageModel`]: token level, "log p(t[i] | t[..i]) for every position of each sequence", run
//!   through a chosen [`AttnMode`]. The trainer's model implements this; [`ModelScorer`] turns it
//!   into a [`Scorer`] with lm-evaluation-harness's tokenisation rules, and
//!   [`crate::validation`] uses it directly for validation loss and bits per byte.

use crate::error::{Error, Result};
use serde::{Deserialize, Serialize};

/// One log-likelihood request: score `continuation` after `context`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Request {
    pub context: String,
    pub continuation: String,
}

/// Result of one request.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct LogLik {
    /// Sum over the continuation's tokens of log p(token | everything before), natural log.
    pub logprob: f64,
    /// Whether every continuation token was the model's argmax (greedy) prediction.
    pub greedy: bool,
}

/// String-level scorer: the interface the task harness runs on.
pub trait Scorer {
    /// Scores every request; returns one [`LogLik`] per request, in order. The harness calls this
    /// with batches of at most its batch size.
    fn loglikelihood(&mut self, requests: &[Request]) -> Result<Vec<LogLik>>;
}

/// Which attention a [`LanguageModel`] evaluates through.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AttnMode {
    /// The attention path the model was trained with (e.g. `mxfp8`).
    Training,
    /// Exact causal attention (the BF16 control numerics). Quality must always be measured here
    /// too: a leaking kernel looks good when evaluated through itself.
    Exact,
}

impl AttnMode {
    /// Name used on the command line and in result files.
    pub fn name(self) -> &'static str {
        match self {
            AttnMode::Training => "training",
            AttnMode::Exact => "exact",
        }
    }
}

impl std::str::FromStr for AttnMode {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "training" => Ok(AttnMode::Training),
            "exact" => Ok(AttnMode::Exact),
            _ => Err(Error::Invalid(format!(
                "unknown attention mode {s:?}; allowed: training, exact"
            ))),
        }
    }
}

/// Score of one predicted token.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TokenScore {
    /// log p(token | prefix), natural log.
    pub logprob: f32,
    /// Whether the token was the argmax of the model's distribution.
    pub greedy: bool,
}

/// Token-level model interface the trainer implements.
pub trait LanguageModel {
    /// Longest sequence (in tokens) one forward pass takes; sequences given to
    /// [`LanguageModel::score_tokens`] have at most `max_len() + 1` tokens.
    fn max_len(&self) -> usize;
    /// Tokenises `text` without special tokens.
    fn encode(&self, text: &str) -> Result<Vec<u32>>;
    /// Token that starts every scored sequence (the document separator the model was trained with,
    /// BOS or EOS).
    fn prefix_token(&self) -> u32;
    /// For each sequence `t` of length `L >= 2`: runs the model on `t[..L-1]` (each sequence is its
    /// own causal document) through `attn` and returns, for `i` in `1..L`, the score of `t[i]` given
    /// `t[..i]` (so `L - 1` scores per sequence).
    fn score_tokens(&mut self, batch: &[Vec<u32>], attn: AttnMode) -> Result<Vec<Vec<TokenScore>>>;
    /// Like [`LanguageModel::score_tokens`], but only the scores of the last `tails[i]` tokens of
    /// sequence `i` are wanted (the continuation of a task request): returns `tails[i]` scores per
    /// sequence. A model should compute log-probabilities for those positions only (gather the
    /// needed rows of the logits; no full-vocabulary copy). The default slices
    /// [`LanguageModel::score_tokens`].
    fn score_tails(
        &mut self,
        batch: &[Vec<u32>],
        tails: &[usize],
        attn: AttnMode,
    ) -> Result<Vec<Vec<TokenScore>>> {
        let all = self.score_tokens(batch, attn)?;
        if all.len() != batch.len() || tails.len() != batch.len() {
            return Err(Error::Scorer(format!(
                "{} score rows and {} tails for {} sequences",
                all.len(),
                tails.len(),
                batch.len()
            )));
        }
        all.into_iter()
            .zip(tails)
            .map(|(row, &n)| {
                if n > row.len() {
                    return Err(Error::Scorer(format!(
                        "tail of {n} tokens but the model returned {} scores",
                        row.len()
                    )));
                }
                Ok(row[row.len() - n..].to_vec())
            })
            .collect()
    }
}

/// A [`Scorer`] over a [`LanguageModel`], following lm-evaluation-harness's `_encode_pair`:
/// trailing whitespace of the context moves to the continuation, the pair is encoded whole and the
/// continuation tokens are what follows the context's own encoding; every sequence starts with the
/// model's prefix token; sequences longer than `max_len() + 1` are cut into [`windows`].
pub struct ModelScorer<'m, M: LanguageModel + ?Sized> {
    model: &'m mut M,
    attn: AttnMode,
}

impl<'m, M: LanguageModel + ?Sized> ModelScorer<'m, M> {
    /// Scores through `attn`.
    pub fn new(model: &'m mut M, attn: AttnMode) -> Self {
        ModelScorer { model, attn }
    }

    /// The token sequence of a request and how many of its last tokens are the continuation.
    pub fn encode_request(&self, req: &Request) -> Result<(Vec<u32>, usize)> {
        let trimmed = req.context.trim_end();
        let (context, continuation) = if trimmed.len() < req.context.len() {
            (
                trimmed.to_string(),
                format!("{}{}", &req.context[trimmed.len()..], req.continuation),
            )
        } else {
            (req.context.clone(), req.continuation.clone())
        };
        let ctx_enc = if context.is_empty() {
            Vec::new()
        } else {
            self.model.encode(&context)?
        };
        let cont_enc = if context.is_empty() {
            self.model.encode(&continuation)?
        } else {
            let whole = self.model.encode(&format!("{context}{continuation}"))?;
            // A tokeniser may merge across the boundary; the continuation is what the whole
            // encoding has beyond the context's token count (lm-evaluation-harness does the same).
            whole
                .get(ctx_enc.len()..)
                .map(<[u32]>::to_vec)
                .unwrap_or_default()
        };
        if cont_enc.is_empty() {
            return Err(Error::Scorer(format!(
                "continuation {:?} encodes to no tokens after context {:?}; every choice must be non-empty",
                req.continuation, req.context
            )));
        }
        let mut seq = vec![self.model.prefix_token()];
        seq.extend(ctx_enc);
        seq.extend(&cont_enc);
        Ok((seq, cont_enc.len()))
    }
}

/// Windows of at most `max_len + 1` tokens that together predict the last `cont_len` tokens of
/// `seq`, each continuation token seeing as much preceding context as fits: returns
/// `(window, predicted)` pairs, `predicted` = how many of the window's last tokens are scored.
/// A sequence that fits is one window cut from the left (what lm-evaluation-harness does); a
/// continuation longer than the context is scored in consecutive chunks of `max_len` tokens.
pub fn windows(seq: &[u32], cont_len: usize, max_len: usize) -> Vec<(Vec<u32>, usize)> {
    let max_len = max_len.max(1);
    let mut out = Vec::new();
    let mut a = seq.len() - cont_len.min(seq.len() - 1);
    while a < seq.len() {
        let b = (a + max_len).min(seq.len());
        let start = b.saturating_sub(max_len + 1);
        out.push((seq[start..b].to_vec(), b - a));
        a = b;
    }
    out
}

impl<M: LanguageModel + ?Sized> Scorer for ModelScorer<'_, M> {
    fn loglikelihood(&mut self, requests: &[Request]) -> Result<Vec<LogLik>> {
        let max = self.model.max_len();
        let mut seqs = Vec::new();
        let mut owner = Vec::new();
        let mut predicted = Vec::new();
        for (i, r) in requests.iter().enumerate() {
            let (s, c) = self.encode_request(r)?;
            for (w, n) in windows(&s, c, max) {
                seqs.push(w);
                owner.push(i);
                predicted.push(n);
            }
        }
        let scores = self.model.score_tails(&seqs, &predicted, self.attn)?;
        if scores.len() != seqs.len() {
            return Err(Error::Scorer(format!(
                "model returned {} score rows for {} sequences",
                scores.len(),
                seqs.len()
            )));
        }
        let mut out = vec![
            LogLik {
                logprob: 0.0,
                greedy: true
            };
            requests.len()
        ];
        for ((row, &i), &n) in scores.iter().zip(&owner).zip(&predicted) {
            if row.len() != n {
                return Err(Error::Scorer(format!(
                    "model returned {} token scores for a continuation of {n} tokens",
                    row.len()
                )));
            }
            let tail = &row[..];
            out[i].logprob += tail.iter().map(|t| f64::from(t.logprob)).sum::<f64>();
            out[i].greedy &= tail.iter().all(|t| t.greedy);
        }
        Ok(out)
    }
}
