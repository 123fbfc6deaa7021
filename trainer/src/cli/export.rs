//! `flamia export`: a checkpoint to Hugging Face `LlamaForCausalLM` format (`config.json` with the
//! tokenizer's BOS/EOS ids, `model.safetensors` in BF16, `tokenizer.json` — generated for the byte
//! tokenizer, copied otherwise — and `tokenizer_config.json`), for lm-evaluation-harness or
//! transformers.

use anyhow::{bail, Context};
use flamia_eval::export::{flamia, write_hf, HfConfig, RopeScaling, TokenizerConfig};
use flamia_trainer::config::TrainConfig;
use std::path::{Path, PathBuf};

#[derive(Debug, clap::Args)]
pub struct ExportArgs {
    /// Checkpoint directory (`RUN/checkpoints/step_NNNNNNNN`).
    #[arg(long)]
    checkpoint: PathBuf,
    /// Output directory.
    #[arg(long)]
    out: PathBuf,
    /// Tokenizer files to copy (default: the run's `data.tokenizer` when it is a tokenizer.json).
    #[arg(long)]
    tokenizer: Vec<PathBuf>,
}

/// The HF config of a checkpoint's model, from its resolved config and vocabulary size.
pub fn hf_config(cfg: &TrainConfig, vocab: usize) -> anyhow::Result<HfConfig> {
    let shape = cfg.model.shape(vocab)?;
    let tok = flamia_data::Tokenizer::from_spec(&cfg.data.tokenizer)
        .with_context(|| format!("loading tokenizer {:?}", cfg.data.tokenizer))?;
    let r = &cfg.model.rope_scaling;
    Ok(HfConfig {
        vocab_size: vocab,
        hidden_size: shape.dim,
        intermediate_size: shape.ffn_dim,
        num_hidden_layers: shape.n_layers,
        num_attention_heads: shape.n_heads,
        num_key_value_heads: shape.n_kv_heads,
        head_dim: shape.head_dim,
        // transformers expects max_position_embeddings >= the scaling's original context.
        max_position_embeddings: if cfg.model.rope_scaled {
            cfg.data.seq_len.max(r.original_max_position)
        } else {
            cfg.data.seq_len
        },
        rms_norm_eps: cfg.model.norm_eps,
        rope_theta: cfg.model.rope_theta,
        rope_scaling: cfg.model.rope_scaled.then_some(RopeScaling {
            factor: r.factor,
            low_freq_factor: r.low_freq_factor,
            high_freq_factor: r.high_freq_factor,
            original_max_position_embeddings: r.original_max_position,
        }),
        tie_word_embeddings: shape.tied,
        bos_token_id: tok.bos_id(),
        eos_token_id: Some(tok.eos_id()),
    })
}

/// The `tokenizer_config.json` of a run: its tokenizer's BOS and EOS spellings and context.
pub fn tokenizer_config(cfg: &TrainConfig) -> anyhow::Result<TokenizerConfig> {
    let tok = flamia_data::Tokenizer::from_spec(&cfg.data.tokenizer)
        .with_context(|| format!("loading tokenizer {:?}", cfg.data.tokenizer))?;
    let name = |id: u32| {
        tok.token_name(id)
            .with_context(|| format!("tokenizer {:?} has no token {id}", cfg.data.tokenizer))
    };
    Ok(TokenizerConfig {
        bos_token: tok.bos_id().map(name).transpose()?,
        eos_token: name(tok.eos_id())?,
        model_max_length: cfg.data.seq_len,
    })
}

/// Reads the resolved config saved in a checkpoint.
pub fn checkpoint_config(dir: &Path) -> anyhow::Result<TrainConfig> {
    let path = dir.join("config.toml");
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    Ok(TrainConfig::from_toml(&text)?)
}

pub fn run(a: ExportArgs) -> anyhow::Result<()> {
    let cfg = checkpoint_config(&a.checkpoint)?;
    let st = a.checkpoint.join("model.safetensors");
    let tensors = flamia::read_safetensors(&st)?;
    let vocab = match tensors.get("tok_embeddings.weight") {
        Some(t) if t.shape.len() == 2 => t.shape[0],
        _ => bail!("{} has no 2-d tok_embeddings.weight", st.display()),
    };
    let hf = hf_config(&cfg, vocab)?;
    let mut tok_files = a.tokenizer.clone();
    let bytes = cfg.data.tokenizer == "bytes";
    if tok_files.is_empty() && !bytes {
        tok_files.push(PathBuf::from(&cfg.data.tokenizer));
    }
    let hf_tensors = flamia::to_hf(&hf, tensors)?;
    write_hf(&hf, &hf_tensors, &a.out, &tok_files)?;
    if bytes && a.tokenizer.is_empty() {
        // The built-in byte tokenizer has no file: write its tokenizer.json equivalent.
        let p = a.out.join("tokenizer.json");
        std::fs::write(&p, flamia_data::tokenizer::byte_tokenizer_json().to_string())
            .with_context(|| format!("writing {}", p.display()))?;
    }
    tokenizer_config(&cfg)?.write(&a.out)?;
    println!("exported {} tensors to {}", hf_tensors.len(), a.out.display());
    Ok(())
}
