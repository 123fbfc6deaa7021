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
        let cfg = TrainConfig::from_toml(&loaded.config_toml)?;
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
        self.tok.eos_id()
    }

    fn score_tokens(
        &mut self,
        batch: &[Vec<u32>],
        attn: AttnMode,
    ) -> flamia_eval::Result<Vec<Vec<TokenScore>>> {
        let mut inputs = Vec::new();
        let mut targets = Vec::new();
        let mut cu = vec![0usize];
        for s in batch {
            if s.len() < 2 || s.len() > self.max_len + 1 {
                return Err(model_err(format!(
                    "sequence of {} tokens; allowed 2..={} (the model's context + 1)",
                    s.len(),
                    self.max_len + 1
                )));
            }
            inputs.extend(s[..s.len() - 1].iter().map(|&t| i64::from(t)));
            targets.extend(s[1..].iter().map(|&t| i64::from(t)));
            cu.push(inputs.len());
        }
        let opts = self.options(attn);
        let (lp, greedy) = tch::no_grad(|| -> flamia_trainer::Result<(Vec<f32>, Vec<i64>)> {
            let input = self.model.input(&inputs, &cu, self.device)?;
            let logits = self.model.forward(&input, &opts, self.compute)?;
            let logp = logits.log_softmax(-1, Kind::Float);
            let tgt = Tensor::from_slice(&targets).to_device(self.device);
            let picked = logp
                .gather(1, &tgt.unsqueeze(1), false)
                .squeeze_dim(1)
                .to_device(Device::Cpu);
            let argmax = logp.argmax(-1, false).to_device(Device::Cpu);
            let lp = Vec::<f32>::try_from(picked)
                .map_err(|e| flamia_trainer::TrainError::Invalid(e.to_string()))?;
            let am = Vec::<i64>::try_from(argmax)
                .map_err(|e| flamia_trainer::TrainError::Invalid(e.to_string()))?;
            Ok((lp, am))
        })
        .map_err(model_err)?;
        Ok(cu
            .windows(2)
            .map(|w| {
                (w[0]..w[1])
                    .map(|i| TokenScore {
                        logprob: lp[i],
                        greedy: greedy[i] == targets[i],
                    })
                    .collect()
            })
            .collect())
    }
}
