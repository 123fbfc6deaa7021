//! Export to Hugging Face `LlamaForCausalLM` format: `config.json` (with the tokenizer's BOS and
//! EOS ids), `model.safetensors`, `tokenizer.json` and a `tokenizer_config.json`, so
//! lm-evaluation-harness (or transformers' `AutoTokenizer` / `AutoModelForCausalLM`) can load a
//! flamia checkpoint.
//!
//! Works on a name -> [`Tensor`] map (dtype, shape, little-endian bytes), so it is testable
//! without libtorch. Tensor layouts are PyTorch `nn.Linear` weights, `(out_features, in_features)`:
//! - `model.embed_tokens.weight` `(vocab, dim)`; `lm_head.weight` `(vocab, dim)` unless tied;
//! - `model.layers.{i}.self_attn.q_proj.weight` `(heads * head_dim, dim)`, `k_proj`/`v_proj`
//!   `(kv_heads * head_dim, dim)`, `o_proj` `(dim, heads * head_dim)`;
//! - `model.layers.{i}.mlp.gate_proj`/`up_proj` `(ffn, dim)`, `down_proj` `(dim, ffn)`;
//! - `model.layers.{i}.input_layernorm`/`post_attention_layernorm` and `model.norm` `(dim,)`.
//!
//! RoPE: transformers' Llama rotates halves (`rotate_half`: pairs `(j, j + head_dim/2)`). A model
//! that rotates interleaved pairs `(2j, 2j+1)` (Meta's original layout) must have its q/k rows
//! permuted with [`interleaved_to_half`], as transformers' `convert_llama_weights_to_hf.py` does.

pub mod flamia;
mod hf;

pub use hf::{expected_shapes, interleaved_to_half, write_hf, HfConfig, RopeScaling, TokenizerConfig};

use crate::error::{Error, Result};
use serde::{Deserialize, Serialize};

/// Element type of a tensor (safetensors names).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Dtype {
    F32,
    BF16,
    F16,
}

impl Dtype {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            Dtype::F32 => 4,
            Dtype::BF16 | Dtype::F16 => 2,
        }
    }
}

/// A dense row-major tensor as raw little-endian bytes.
#[derive(Debug, Clone, PartialEq)]
pub struct Tensor {
    pub dtype: Dtype,
    pub shape: Vec<usize>,
    pub data: Vec<u8>,
}

impl Tensor {
    /// Checks that the byte length matches the shape and dtype.
    pub fn new(dtype: Dtype, shape: Vec<usize>, data: Vec<u8>) -> Result<Tensor> {
        let want = shape.iter().product::<usize>() * dtype.size();
        if data.len() != want {
            return Err(Error::Export(format!(
                "tensor of shape {shape:?} {dtype:?} needs {want} bytes, got {}",
                data.len()
            )));
        }
        Ok(Tensor { dtype, shape, data })
    }

    /// An f32 tensor.
    pub fn from_f32(shape: Vec<usize>, values: &[f32]) -> Result<Tensor> {
        Tensor::new(
            Dtype::F32,
            shape,
            values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        )
    }

    /// Converts to BF16 (round to nearest even; NaN stays NaN).
    pub fn to_bf16(&self) -> Tensor {
        let data = match self.dtype {
            Dtype::BF16 => self.data.clone(),
            Dtype::F32 => self
                .data
                .chunks_exact(4)
                .flat_map(|c| f32_to_bf16(f32::from_le_bytes([c[0], c[1], c[2], c[3]])).to_le_bytes())
                .collect(),
            Dtype::F16 => self
                .data
                .chunks_exact(2)
                .flat_map(|c| f32_to_bf16(f16_to_f32(u16::from_le_bytes([c[0], c[1]]))).to_le_bytes())
                .collect(),
        };
        Tensor {
            dtype: Dtype::BF16,
            shape: self.shape.clone(),
            data,
        }
    }
}

fn f32_to_bf16(x: f32) -> u16 {
    let b = x.to_bits();
    if x.is_nan() {
        return ((b >> 16) as u16) | 0x40;
    }
    let round = 0x7fff + ((b >> 16) & 1);
    (b.wrapping_add(round) >> 16) as u16
}

fn f16_to_f32(h: u16) -> f32 {
    let sign = u32::from(h >> 15) << 31;
    let exp = u32::from((h >> 10) & 0x1f);
    let man = u32::from(h & 0x3ff);
    let bits = match (exp, man) {
        (0, 0) => sign,
        (0, m) => {
            // Subnormal: value = m * 2^-24.
            let v = m as f32 * (2f32).powi(-24);
            return if sign != 0 { -v } else { v };
        }
        (0x1f, m) => sign | 0x7f80_0000 | (m << 13),
        (e, m) => sign | ((e + 112) << 23) | (m << 13),
    };
    f32::from_bits(bits)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_rounds_to_nearest_even() {
        assert_eq!(f32_to_bf16(1.0), 0x3f80);
        // 1 + 2^-8 is exactly half way between bf16 1.0 and 1.0078125: ties to even (1.0).
        assert_eq!(f32_to_bf16(1.0 + 1.0 / 256.0), 0x3f80);
        assert_eq!(f32_to_bf16(1.0 + 3.0 / 256.0), 0x3f82);
        assert_eq!(f16_to_f32(0x3c00), 1.0);
        assert_eq!(f16_to_f32(0xc000), -2.0);
    }
}
