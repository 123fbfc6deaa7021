//! `LlamaForCausalLM` config, the expected tensor names and shapes, the RoPE row permutation and
//! the writer of `config.json` + `model.safetensors` + `tokenizer.json` (+ `tokenizer_config.json`).
//! Every file is written as `NAME.tmp`, fsynced and renamed into place, so a failed export never
//! leaves a truncated file (a file of an earlier export into the same directory stays whole until
//! its replacement is complete).

use super::{Dtype, Tensor};
use crate::error::{Error, Result};
use serde::{Deserialize, Serialize};
use serde_json::json;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Llama-3 RoPE frequency scaling (`rope_scaling` with `rope_type: llama3`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct RopeScaling {
    pub factor: f64,
    pub low_freq_factor: f64,
    pub high_freq_factor: f64,
    pub original_max_position_embeddings: usize,
}

/// The architecture facts a `LlamaForCausalLM` `config.json` needs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HfConfig {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    pub head_dim: usize,
    pub max_position_embeddings: usize,
    pub rms_norm_eps: f64,
    pub rope_theta: f64,
    pub rope_scaling: Option<RopeScaling>,
    pub tie_word_embeddings: bool,
    pub bos_token_id: Option<u32>,
    pub eos_token_id: Option<u32>,
}

impl HfConfig {
    /// The `config.json` object.
    pub fn to_json(&self) -> serde_json::Value {
        json!({
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "max_position_embeddings": self.max_position_embeddings,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_scaling": self.rope_scaling.map(|r| json!({
                "rope_type": "llama3",
                "factor": r.factor,
                "low_freq_factor": r.low_freq_factor,
                "high_freq_factor": r.high_freq_factor,
                "original_max_position_embeddings": r.original_max_position_embeddings,
            })),
            "tie_word_embeddings": self.tie_word_embeddings,
            "hidden_act": "silu",
            "attention_bias": false,
            "attention_dropout": 0.0,
            "mlp_bias": false,
            "initializer_range": 0.02,
            "pretraining_tp": 1,
            "use_cache": true,
            "torch_dtype": "bfloat16",
            "bos_token_id": self.bos_token_id,
            "eos_token_id": self.eos_token_id,
        })
    }

    fn validate(&self) -> Result<()> {
        if self.num_attention_heads == 0
            || self.num_key_value_heads == 0
            || !self.num_attention_heads.is_multiple_of(self.num_key_value_heads)
        {
            return Err(Error::Export(format!(
                "num_attention_heads ({}) must be a positive multiple of num_key_value_heads ({})",
                self.num_attention_heads, self.num_key_value_heads
            )));
        }
        if !self.head_dim.is_multiple_of(2) {
            return Err(Error::Export(format!(
                "head_dim {} must be even for RoPE",
                self.head_dim
            )));
        }
        Ok(())
    }
}

/// What `tokenizer_config.json` tells transformers' `AutoTokenizer` (a `PreTrainedTokenizerFast`
/// over the exported `tokenizer.json`).
#[derive(Debug, Clone, PartialEq)]
pub struct TokenizerConfig {
    /// The token that starts every training document, if the tokenizer has one. `add_bos_token`
    /// is written as whether there is one: the exported `tokenizer.json`'s post-processor puts it
    /// before every encoding made with special tokens (transformers' default).
    pub bos_token: Option<String>,
    /// The end-of-text token.
    pub eos_token: String,
    /// The context the model was trained with.
    pub model_max_length: usize,
}

impl TokenizerConfig {
    /// The `tokenizer_config.json` object.
    pub fn to_json(&self) -> serde_json::Value {
        json!({
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": self.bos_token,
            "eos_token": self.eos_token,
            "add_bos_token": self.bos_token.is_some(),
            "add_eos_token": false,
            "model_max_length": self.model_max_length,
            "clean_up_tokenization_spaces": false,
            "model_input_names": ["input_ids", "attention_mask"],
        })
    }

    /// Writes `out_dir/tokenizer_config.json` (atomically).
    pub fn write(&self, out_dir: &Path) -> Result<()> {
        std::fs::create_dir_all(out_dir).map_err(|e| Error::io(out_dir, e))?;
        let text = serde_json::to_string_pretty(&self.to_json()).map_err(|e| Error::Export(e.to_string()))?;
        write_atomic(&out_dir.join("tokenizer_config.json"), (text + "\n").as_bytes())
    }
}

/// `path` + `.tmp`: where a file is written before it is renamed into place.
fn temp_path(path: &Path) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(".tmp");
    PathBuf::from(s)
}

/// Fsyncs the finished temporary file of `path`, renames it over `path` and fsyncs the directory.
fn commit(tmp: &Path, path: &Path) -> Result<()> {
    std::fs::File::open(tmp)
        .and_then(|f| f.sync_all())
        .map_err(|e| Error::io(tmp, e))?;
    std::fs::rename(tmp, path).map_err(|e| Error::io(path, e))?;
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| Error::io(dir, e))
}

/// Writes `bytes` to `path` through `path.tmp` (removed if the write fails).
fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let tmp = temp_path(path);
    let r = std::fs::write(&tmp, bytes)
        .map_err(|e| Error::io(&tmp, e))
        .and_then(|_| commit(&tmp, path));
    if r.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    r
}

/// Every tensor a `LlamaForCausalLM` with `cfg` has, with its shape.
pub fn expected_shapes(cfg: &HfConfig) -> BTreeMap<String, Vec<usize>> {
    let (d, f, v) = (cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size);
    let q = cfg.num_attention_heads * cfg.head_dim;
    let kv = cfg.num_key_value_heads * cfg.head_dim;
    let mut m = BTreeMap::new();
    m.insert("model.embed_tokens.weight".to_string(), vec![v, d]);
    m.insert("model.norm.weight".to_string(), vec![d]);
    if !cfg.tie_word_embeddings {
        m.insert("lm_head.weight".to_string(), vec![v, d]);
    }
    for i in 0..cfg.num_hidden_layers {
        let p = format!("model.layers.{i}");
        for (name, shape) in [
            ("self_attn.q_proj.weight", vec![q, d]),
            ("self_attn.k_proj.weight", vec![kv, d]),
            ("self_attn.v_proj.weight", vec![kv, d]),
            ("self_attn.o_proj.weight", vec![d, q]),
            ("mlp.gate_proj.weight", vec![f, d]),
            ("mlp.up_proj.weight", vec![f, d]),
            ("mlp.down_proj.weight", vec![d, f]),
            ("input_layernorm.weight", vec![d]),
            ("post_attention_layernorm.weight", vec![d]),
        ] {
            m.insert(format!("{p}.{name}"), shape);
        }
    }
    m
}

/// Permutes the rows of a q or k projection `(heads * head_dim, in)` from interleaved RoPE pairs
/// `(2j, 2j+1)` to transformers' half-split pairs `(j, j + head_dim/2)`: within each head, new row
/// `j` = old row `2j`, new row `head_dim/2 + j` = old row `2j + 1`.
pub fn interleaved_to_half(t: &Tensor, heads: usize, head_dim: usize) -> Result<Tensor> {
    if t.shape.len() != 2 || t.shape[0] != heads * head_dim || !head_dim.is_multiple_of(2) {
        return Err(Error::Export(format!(
            "RoPE permutation needs a (heads * head_dim, in) = ({heads} * {head_dim}, _) weight with even \
             head_dim, got shape {:?}",
            t.shape
        )));
    }
    let row = t.shape[1] * t.dtype.size();
    let mut data = vec![0u8; t.data.len()];
    let half = head_dim / 2;
    for h in 0..heads {
        for j in 0..head_dim {
            let src = if j < half { 2 * j } else { 2 * (j - half) + 1 };
            let (dst, src) = ((h * head_dim + j) * row, (h * head_dim + src) * row);
            data[dst..dst + row].copy_from_slice(&t.data[src..src + row]);
        }
    }
    Ok(Tensor {
        dtype: t.dtype,
        shape: t.shape.clone(),
        data,
    })
}

/// Writes `config.json`, `model.safetensors` (every tensor converted to BF16) and `tokenizer`
/// as `tokenizer.json` (the name transformers' `AutoTokenizer` loads, whatever the tokenizer's
/// file was called) into `out_dir`, each atomically. `tensors` must hold exactly the names of
/// [`expected_shapes`] with those shapes; errors list what is missing, extra or misshapen.
pub fn write_hf(
    cfg: &HfConfig,
    tensors: &BTreeMap<String, Tensor>,
    out_dir: &Path,
    tokenizer: &serde_json::Value,
) -> Result<()> {
    cfg.validate()?;
    let want = expected_shapes(cfg);
    let missing: Vec<&String> = want.keys().filter(|k| !tensors.contains_key(*k)).collect();
    let extra: Vec<&String> = tensors.keys().filter(|k| !want.contains_key(*k)).collect();
    let wrong: Vec<String> = want
        .iter()
        .filter_map(|(k, s)| {
            tensors
                .get(k)
                .filter(|t| &t.shape != s)
                .map(|t| format!("{k}: {:?}, want {s:?}", t.shape))
        })
        .collect();
    if !missing.is_empty() || !extra.is_empty() || !wrong.is_empty() {
        return Err(Error::Export(format!(
            "tensor set does not match LlamaForCausalLM: missing {missing:?}, unexpected {extra:?}, wrong shape {wrong:?}"
        )));
    }
    std::fs::create_dir_all(out_dir).map_err(|e| Error::io(out_dir, e))?;
    let bf16: BTreeMap<&String, Tensor> = tensors.iter().map(|(k, t)| (k, t.to_bf16())).collect();
    let views = bf16
        .iter()
        .map(|(k, t)| {
            safetensors::tensor::TensorView::new(safetensors::Dtype::BF16, t.shape.clone(), &t.data)
                .map(|v| (k.to_string(), v))
                .map_err(|e| Error::Export(format!("{k}: {e}")))
        })
        .collect::<Result<Vec<_>>>()?;
    let meta = std::collections::HashMap::from([("format".to_string(), "pt".to_string())]);
    let st = out_dir.join("model.safetensors");
    let st_tmp = temp_path(&st);
    let written = safetensors::tensor::serialize_to_file(views, Some(meta), &st_tmp)
        .map_err(|e| Error::Export(format!("{}: {e}", st.display())))
        .and_then(|_| commit(&st_tmp, &st));
    if written.is_err() {
        let _ = std::fs::remove_file(&st_tmp);
    }
    written?;
    let text = serde_json::to_string_pretty(&cfg.to_json()).map_err(|e| Error::Export(e.to_string()))?;
    write_atomic(&out_dir.join("config.json"), (text + "\n").as_bytes())?;
    let text = serde_json::to_string(tokenizer).map_err(|e| Error::Export(e.to_string()))?;
    write_atomic(&out_dir.join("tokenizer.json"), text.as_bytes())?;
    debug_assert!(bf16.values().all(|t| t.dtype == Dtype::BF16));
    Ok(())
}
