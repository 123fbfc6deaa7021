//! The trainer's checkpoint layout -> Hugging Face Llama names.
//!
//! Trainer names (`trainer/src/model/mod.rs`, the tch `VarStore` paths written to
//! `checkpoints/step_NNNNNNNN/model.safetensors`, f32):
//! `tok_embeddings.weight`, `layers.{i}.attention.{wq,wk,wv,wo}.weight`,
//! `layers.{i}.attention_norm.weight`, `layers.{i}.feed_forward.{w1,w2,w3}.weight`,
//! `layers.{i}.ffn_norm.weight`, `norm.weight`, `output.weight` (untied only). `w1` is the gate,
//! `w3` the up and `w2` the down projection. The trainer's RoPE rotates interleaved pairs
//! `(2j, 2j+1)`, so `wq`/`wk` rows are permuted to transformers' half-split layout.

use super::{interleaved_to_half, HfConfig, Tensor};
use crate::error::{Error, Result};
use std::collections::BTreeMap;
use std::path::Path;

/// The HF name of a trainer parameter, and whether its rows need the RoPE permutation
/// (`Some(n_heads)` for q, `Some(n_kv_heads)` for k).
pub fn hf_name(name: &str, cfg: &HfConfig) -> Option<(String, Option<usize>)> {
    match name {
        "tok_embeddings.weight" => return Some(("model.embed_tokens.weight".into(), None)),
        "norm.weight" => return Some(("model.norm.weight".into(), None)),
        "output.weight" => return Some(("lm_head.weight".into(), None)),
        _ => {}
    }
    let rest = name.strip_prefix("layers.")?;
    let (i, param) = rest.split_once('.')?;
    let i: usize = i.parse().ok()?;
    let (hf, perm) = match param {
        "attention.wq.weight" => ("self_attn.q_proj.weight", Some(cfg.num_attention_heads)),
        "attention.wk.weight" => ("self_attn.k_proj.weight", Some(cfg.num_key_value_heads)),
        "attention.wv.weight" => ("self_attn.v_proj.weight", None),
        "attention.wo.weight" => ("self_attn.o_proj.weight", None),
        "feed_forward.w1.weight" => ("mlp.gate_proj.weight", None),
        "feed_forward.w3.weight" => ("mlp.up_proj.weight", None),
        "feed_forward.w2.weight" => ("mlp.down_proj.weight", None),
        "attention_norm.weight" => ("input_layernorm.weight", None),
        "ffn_norm.weight" => ("post_attention_layernorm.weight", None),
        _ => return None,
    };
    Some((format!("model.layers.{i}.{hf}"), perm))
}

/// Renames (and RoPE-permutes) a trainer tensor map into HF names. Unknown names are an error.
pub fn to_hf(cfg: &HfConfig, tensors: BTreeMap<String, Tensor>) -> Result<BTreeMap<String, Tensor>> {
    let mut out = BTreeMap::new();
    for (name, t) in tensors {
        let (hf, perm) = hf_name(&name, cfg).ok_or_else(|| {
            Error::Export(format!(
                "checkpoint tensor {name:?} has no LlamaForCausalLM counterpart"
            ))
        })?;
        let t = match perm {
            Some(heads) => interleaved_to_half(&t, heads, cfg.head_dim)?,
            None => t,
        };
        out.insert(hf, t);
    }
    Ok(out)
}

/// Reads every tensor of a safetensors file (F32, BF16 or F16).
pub fn read_safetensors(path: &Path) -> Result<BTreeMap<String, Tensor>> {
    let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
    let st = safetensors::SafeTensors::deserialize(&bytes)
        .map_err(|e| Error::Export(format!("{}: {e}", path.display())))?;
    st.tensors()
        .into_iter()
        .map(|(name, v)| {
            let dtype = match v.dtype() {
                safetensors::Dtype::F32 => super::Dtype::F32,
                safetensors::Dtype::BF16 => super::Dtype::BF16,
                safetensors::Dtype::F16 => super::Dtype::F16,
                other => {
                    return Err(Error::Export(format!(
                        "{}: tensor {name} has dtype {other:?}; allowed: F32, BF16, F16",
                        path.display()
                    )))
                }
            };
            Ok((name, Tensor::new(dtype, v.shape().to_vec(), v.data().to_vec())?))
        })
        .collect()
}
