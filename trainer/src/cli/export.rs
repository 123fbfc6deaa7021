//! `flamia export`: a checkpoint to Hugging Face `LlamaForCausalLM` format (`config.json` with the
//! tokenizer's BOS/EOS ids, `model.safetensors` in BF16, `tokenizer.json` and
//! `tokenizer_config.json`), for lm-evaluation-harness or transformers.
//!
//! The tokenizer is `--tokenizer` when given, else the run's `data.tokenizer`; it is written as
//! `tokenizer.json` whatever its file is called (generated for the byte tokenizer), with a
//! post-processor that puts BOS before every encoding made with special tokens, as training put
//! it before every document ([`flamia_data::Tokenizer::export_json`]).

use anyhow::{bail, Context};
use flamia_data::Tokenizer;
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
    /// The tokenizer the run trained with: "bytes" or a tokenizer.json (any file name; written as
    /// tokenizer.json). Default: the run's `data.tokenizer`. Give it when that path is gone or
    /// moved; BOS/EOS ids come from this tokenizer, and its vocabulary must fit the checkpoint.
    #[arg(long)]
    tokenizer: Option<String>,
}

/// The HF config of a checkpoint's model, from its resolved config, vocabulary size (embedding
/// rows) and tokenizer (BOS/EOS ids).
pub fn hf_config(cfg: &TrainConfig, vocab: usize, tok: &Tokenizer) -> anyhow::Result<HfConfig> {
    let shape = cfg.model.shape(vocab)?;
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
pub fn tokenizer_config(cfg: &TrainConfig, tok: &Tokenizer) -> anyhow::Result<TokenizerConfig> {
    let name = |id: u32| {
        tok.token_name(id)
            .with_context(|| format!("tokenizer {:?} has no token {id}", tok.spec()))
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
    // (as it was saved: not re-validated against this environment or a later build's rules)
    TrainConfig::from_saved_toml(&text).with_context(|| format!("{}", path.display()))
}

/// The export's tokenizer: `--tokenizer`, else the run's `data.tokenizer`. Its vocabulary must
/// give the checkpoint's embedding rows (`model.shape` pads it to `model.vocab_size`); a
/// `--tokenizer` that differs from a still loadable `data.tokenizer` is used with a warning.
pub fn export_tokenizer(cfg: &TrainConfig, given: Option<&str>, rows: usize) -> anyhow::Result<Tokenizer> {
    let spec = given.unwrap_or(&cfg.data.tokenizer);
    let tok = Tokenizer::from_spec(spec).with_context(|| {
        if given.is_some() {
            format!("loading --tokenizer {spec:?}")
        } else {
            format!("loading the run's data.tokenizer {spec:?} (moved? give its file with --tokenizer)")
        }
    })?;
    let want = cfg.model.shape(tok.vocab_size())?.vocab;
    if want != rows {
        let ids = if want == tok.vocab_size() {
            format!("{want} ids")
        } else {
            format!("{} ids, padded to model.vocab_size = {want}", tok.vocab_size())
        };
        bail!(
            "tokenizer {spec:?} has {ids}, but the checkpoint's tok_embeddings has {rows} rows: it is not the tokenizer this run trained with (data.tokenizer = {:?}); give that one with --tokenizer",
            cfg.data.tokenizer
        );
    }
    if given.is_some_and(|g| g != cfg.data.tokenizer) {
        if let Ok(run_tok) = Tokenizer::from_spec(&cfg.data.tokenizer) {
            if run_tok.fingerprint() != tok.fingerprint() {
                tracing::warn!(
                    "--tokenizer {spec:?} ({}) differs from the run's data.tokenizer {:?} ({}): exporting with --tokenizer",
                    tok.fingerprint(),
                    cfg.data.tokenizer,
                    run_tok.fingerprint()
                );
            }
        }
    }
    Ok(tok)
}

pub fn run(a: ExportArgs) -> anyhow::Result<()> {
    let cfg = checkpoint_config(&a.checkpoint)?;
    let st = a.checkpoint.join("model.safetensors");
    let tensors = flamia::read_safetensors(&st)?;
    let vocab = match tensors.get("tok_embeddings.weight") {
        Some(t) if t.shape.len() == 2 => t.shape[0],
        _ => bail!("{} has no 2-d tok_embeddings.weight", st.display()),
    };
    let tok = export_tokenizer(&cfg, a.tokenizer.as_deref(), vocab)?;
    let hf = hf_config(&cfg, vocab, &tok)?;
    let tok_json = tok
        .export_json()
        .with_context(|| format!("reading tokenizer {:?}", tok.spec()))?;
    let hf_tensors = flamia::to_hf(&hf, tensors)?;
    write_hf(&hf, &hf_tensors, &a.out, &tok_json)?;
    tokenizer_config(&cfg, &tok)?.write(&a.out)?;
    println!(
        "exported {} tensors and tokenizer {} (as tokenizer.json) to {}",
        hf_tensors.len(),
        tok.spec(),
        a.out.display()
    );
    if tok.bos_id().is_some() {
        println!(
            "the model expects BOS first: transformers adds it by default; for lm-evaluation-harness give --model_args pretrained={},add_bos_token=True",
            a.out.display()
        );
    }
    Ok(())
}
