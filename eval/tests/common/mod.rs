//! Shared test helpers: fixture paths and a byte-level toy language model.

#![allow(dead_code)]

use flamia_eval::{AttnMode, LanguageModel, Result, TokenScore};
use std::path::PathBuf;

/// `eval/fixtures/tasks`.
pub fn task_fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures")
        .join("tasks")
}

/// Byte-level model: token = byte + 1 (0 is the prefix token). Scores are planted: through exact
/// attention every token has log-probability `-ln 256` (so bits per byte is exactly 8); through
/// the training path `-ln 128` (a "leak" that makes it look one bit per byte better).
/// Records the batches it was given.
#[derive(Default)]
pub struct ByteModel {
    pub max_len: usize,
    pub calls: Vec<(usize, AttnMode)>,
    pub seqs: Vec<Vec<u32>>,
}

impl ByteModel {
    pub fn new(max_len: usize) -> Self {
        ByteModel {
            max_len,
            ..Default::default()
        }
    }
}

impl LanguageModel for ByteModel {
    fn max_len(&self) -> usize {
        self.max_len
    }
    fn encode(&self, text: &str) -> Result<Vec<u32>> {
        Ok(text.bytes().map(|b| u32::from(b) + 1).collect())
    }
    fn prefix_token(&self) -> u32 {
        0
    }
    fn score_tokens(&mut self, batch: &[Vec<u32>], attn: AttnMode) -> Result<Vec<Vec<TokenScore>>> {
        self.calls.push((batch.len(), attn));
        self.seqs.extend(batch.iter().cloned());
        let lp = match attn {
            AttnMode::Exact => -(256f32).ln(),
            AttnMode::Training => -(128f32).ln(),
        };
        Ok(batch
            .iter()
            .map(|s| {
                assert!(
                    s.len() >= 2 && s.len() <= self.max_len + 1,
                    "bad sequence length {}",
                    s.len()
                );
                s[1..]
                    .iter()
                    .map(|&t| TokenScore {
                        logprob: lp,
                        greedy: t == u32::from(b' ') + 1,
                    })
                    .collect()
            })
            .collect())
    }
}
