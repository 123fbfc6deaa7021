//! `LlamaForCausalLM` config, the expected tensor names and shapes, the RoPE row permutation and
//! the writer of `config.json` + `model.safetensors` + tokenizer files.

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
    /// The token that starts every training document, if the tokenizer has one.
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
            "model_max_length": self.model_max_length,
            "clean_up_tokenization_spaces": false,
            "model_input_names": ["input_ids", "attention_mask"],
        })
    }

    /// Writes `out_dir/tokenizer_config.json`.
    pub fn write(&self, out_dir: &Path) -> Result<()> {
        std::fs::create_dir_all(out_dir).map_err(|e| Error::io(out_dir, e))?;
        let p = out_dir.join("tokenizer_config.json");
        let text = serde_json::to_string_pretty(&self.to_json()).map_err(|e| Error::Export(e.to_string()))?;
        std::fs::write(&p, text + "\n").map_err(|e| Error::io(&p, e))
    }
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

/// Writes `config.json`, `model.safetensors` (every tensor converted to BF16) and copies the
/// `tokenizer_files` into `out_dir`. `tensors` must hold exactly the names of
/// [`expected_shapes`] with those shapes; errors list what is missing, extra or misshapen.
pub fn write_hf(
    cfg: &HfConfig,
    tensors: &BTreeMap<String, Tensor>,
    out_dir: &Path,
    tokenizer_files: &[PathBuf],
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
    safetensors::tensor::serialize_to_file(views, Some(meta), &st)
        .map_err(|e| Error::Export(format!("{}: {e}", st.display())))?;
    let cfg_path = out_dir.join("config.json");
    let text = serde_json::to_string_pretty(&cfg.to_json()).map_err(|e| Error::Export(e.to_string()))?;
    std::fs::write(&cfg_path, text + "\n").map_err(|e| Error::io(&cfg_path, e))?;
    for f in tokenizer_files {
        let name = f
            .file_name()
            .ok_or_else(|| Error::Export(format!("tokenizer path {} has no file name", f.display())))?;
        std::fs::copy(f, out_dir.join(name)).map_err(|e| Error::io(f, e))?;
    }
    debug_assert!(bf16.values().all(|t| t.dtype == Dtype::BF16));
    Ok(())
}
