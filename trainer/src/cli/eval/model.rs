//! The trainer's model behind `flamia_eval::LanguageModel`: loads a checkpoint (weights, resolved
//! config, tokenizer) and scores packed batches, each sequence its own causal document, through the
//! attention path it was trained with or through exact attention.

use anyhow::Context;
use flamia_eval::{AttnMode, LanguageModel, TokenScore};
use flamia_kernels::{AttnOptions, AttnPath};
use flamia_trainer::checkpoint;
use flamia_trainer::config::TrainConfig;
use flamia_trainer::device::{compute_kind, parse_device};
use flamia_trainer::model::Llama;
use std::path::Path;
use tch::{Device, Kind, Tensor};

/// A checkpoint loaded for evaluation.
pub struct TrainedModel {
    pub cfg: TrainConfig,
    pub step: usize,
    model: Llama,
    tok: flamia_data::Tokenizer,
    device: Device,
    compute: Kind,
    train_attn: AttnOptions,
    max_len: usize,
}

impl TrainedModel {
    /// Loads `dir` (`RUN/checkpoints/step_NNNNNNNN`) onto `device` (`auto`, `cpu`, `cuda:N`; `None`
    /// = the run's own setting).
    pub fn load(dir: &Path, device: Option<&str>) -> anyhow::Result<TrainedModel> {
        let loaded =
            checkpoint::load(dir).with_context(|| format!("loading checkpoint {}", dir.display()))?;
        // (as it was saved: a checkpoint of a deterministic mxfp8 run must load in a shell without
        // its CUBLAS_WORKSPACE_CONFIG, or under a later build's rules)
        let cfg = TrainConfig::from_saved_toml(&loaded.config_toml)
            .with_context(|| format!("{}", dir.join("config.toml").display()))?;
        let device = parse_device(device.unwrap_or(&cfg.run.device))?;
        let compute = compute_kind(&cfg.run.compute, device);
        let tok = flamia_data::Tokenizer::from_spec(&cfg.data.tokenizer)
            .with_context(|| format!("loading the run's tokenizer {:?}", cfg.data.tokenizer))?;
        let model = Llama::new(&cfg.model, tok.vocab_size(), device)?;
        checkpoint::restore_params(&model.named_parameters(), loaded.model)?;
        let train_attn = cfg.attention.options()?;
        let max_len = cfg.data.seq_len;
        Ok(TrainedModel {
            step: loaded.state.step,
            cfg,
            model,
            tok,
            device,
            compute,
            train_attn,
            max_len,
        })
    }

    fn options(&self, attn: AttnMode) -> AttnOptions {
        match attn {
            AttnMode::Training => self.train_attn,
            AttnMode::Exact => AttnOptions {
                path: AttnPath::Exact,
                ..self.train_attn
            },
        }
    }
}

fn model_err(e: impl std::fmt::Display) -> flamia_eval::Error {
    flamia_eval::Error::Scorer(e.to_string())
}

impl LanguageModel for TrainedModel {
    fn max_len(&self) -> usize {
        self.max_len
    }

    fn encode(&self, text: &str) -> flamia_eval::Result<Vec<u32>> {
        self.tok.encode(text).map_err(model_err)
    }

    fn prefix_token(&self) -> u32 {
        // Training starts every document with BOS; tokenizers without one start with EOS.
        self.tok.bos_id().unwrap_or_else(|| self.tok.eos_id())
    }

    fn score_tokens(
        &mut self,
        batch: &[Vec<u32>],
        attn: AttnMode,
    ) -> flamia_eval::Result<Vec<Vec<TokenScore>>> {
        let tails: Vec<usize> = batch.iter().map(|s| s.len().saturating_sub(1)).collect();
        self.score_tails(batch, &tails, attn)
    }

    fn score_tails(
        &mut self,
        batch: &[Vec<u32>],
        tails: &[usize],
        attn: AttnMode,
    ) -> flamia_eval::Result<Vec<Vec<TokenScore>>> {
        let mut inputs = Vec::new();
        let mut cu = vec![0usize];
        // Packed positions whose prediction is wanted, and the token each must predict.
        let mut rows = Vec::new();
        let mut targets = Vec::new();
        for (s, &tail) in batch.iter().zip(tails) {
            if s.len() < 2 || s.len() > self.max_len + 1 || tail > s.len() - 1 {
                return Err(model_err(format!(
                    "sequence of {} tokens with {tail} scored; allowed 2..={} tokens (the model's context + 1), at most all but the first scored",
                    s.len(),
                    self.max_len + 1
                )));
            }
            let base = inputs.len();
            inputs.extend(s[..s.len() - 1].iter().map(|&t| i64::from(t)));
            for i in s.len() - 1 - tail..s.len() - 1 {
                rows.push((base + i) as i64);
                targets.push(i64::from(s[i + 1]));
            }
            cu.push(inputs.len());
        }
        let opts = self.options(attn);
        let (lp, greedy) = tch::no_grad(|| -> flamia_trainer::Result<(Vec<f32>, Vec<i64>)> {
            let input = self.model.input(&inputs, &cu, self.device)?;
            let hidden = self.model.hidden(&input, &opts, self.compute)?;
            let w_out = self.model.output_weight().to_kind(self.compute);
            token_logprobs(&hidden, &w_out, &rows, &targets, self.device)
        })
        .map_err(model_err)?;
        let mut at = 0;
        Ok(tails
            .iter()
            .map(|&n| {
                let row = (at..at + n)
                    .map(|i| TokenScore {
                        logprob: lp[i],
                        greedy: greedy[i] == targets[i],
                    })
                    .collect();
                at += n;
                row
            })
            .collect())
    }
}

/// Positions scored per chunk: bounds the `(chunk, vocab)` logits made at once.
const SCORE_CHUNK: usize = 1024;

/// log p(target | prefix) and the argmax at packed positions `rows`, from the final hidden states
/// `(tokens, dim)` and the output projection `(vocab, dim)`: only those rows are projected to
/// logits (in chunks of [`SCORE_CHUNK`]), the log-softmax is `logit[target] - logsumexp(logits)`
/// per row, and one float and one id per position come back to the host. No `(tokens, vocab)`
/// tensor of the whole batch is ever made.
pub fn token_logprobs(
    hidden: &Tensor,
    w_out: &Tensor,
    rows: &[i64],
    targets: &[i64],
    device: Device,
) -> flamia_trainer::Result<(Vec<f32>, Vec<i64>)> {
    let conv = |e: tch::TchError| flamia_trainer::TrainError::Invalid(e.to_string());
    let mut lp = Vec::with_capacity(rows.len());
    let mut am = Vec::with_capacity(rows.len());
    for (r, t) in rows.chunks(SCORE_CHUNK).zip(targets.chunks(SCORE_CHUNK)) {
        let idx = Tensor::from_slice(r).to_device(device);
        let tgt = Tensor::from_slice(t).to_device(device);
        let l = hidden
            .index_select(0, &idx)
            .linear(w_out, None::<Tensor>)
            .to_kind(Kind::Float);
        let picked = l.gather(1, &tgt.unsqueeze(1), false).squeeze_dim(1);
        let lse = l.logsumexp([-1i64].as_slice(), false);
        let p = (picked - lse).to_device(Device::Cpu);
        let a = l.argmax(-1, false).to_device(Device::Cpu);
        lp.extend(Vec::<f32>::try_from(p).map_err(conv)?);
        am.extend(Vec::<i64>::try_from(a).map_err(conv)?);
    }
    Ok((lp, am))
}
