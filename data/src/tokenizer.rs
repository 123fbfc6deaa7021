//! Tokenisers: the built-in byte-level tokenizer (no file: ids 0..=255 are bytes, then specials)
//! and Hugging Face `tokenizer.json` files through the `tokenizers` crate.

use std::path::{Path, PathBuf};

use crate::error::{DataError, Result};

/// Special tokens of the byte tokenizer, in id order after the 256 byte ids.
pub const BYTE_SPECIALS: [&str; 2] = ["<|end_of_text|>", "<|begin_of_text|>"];

/// End-of-document token names looked up in a `tokenizer.json`, first match wins.
pub const EOS_NAMES: [&str; 4] = ["<|end_of_text|>", "<|endoftext|>", "</s>", "<eos>"];

/// Beginning-of-document token names looked up in a `tokenizer.json`, first match wins. A
/// tokenizer without any (GPT-2's) starts documents with no BOS.
pub const BOS_NAMES: [&str; 4] = ["<|begin_of_text|>", "<s>", "<bos>", "<|startoftext|>"];

/// Version tag that starts the fingerprint of a `tokenizer.json` tokenizer. `hf` (version 1)
/// encoded special-token text inside documents as special ids (`<|end_of_text|>` in a web page
/// became a real end-of-text), honoured the file's truncation and padding, and counted distinct
/// tokens as the vocabulary; `hf-v2` encodes special-token text as plain text, never truncates or
/// pads, and sizes the vocabulary as the largest id + 1. Shards and data states made under
/// another tag are refused.
pub const HF_FINGERPRINT_TAG: &str = "hf-v2";

/// A tokenizer the pipeline can run from many threads at once.
#[derive(Debug, Clone)]
pub enum Tokenizer {
    /// UTF-8 bytes as ids 0..=255; `<|end_of_text|>` = 256, `<|begin_of_text|>` = 257.
    Bytes,
    /// A Hugging Face tokenizer loaded from `path`.
    Hf {
        path: PathBuf,
        inner: Box<tokenizers::Tokenizer>,
        eos: u32,
        bos: Option<u32>,
        vocab: usize,
    },
}

impl Tokenizer {
    /// `"bytes"` gives the byte tokenizer; anything else is read as a `tokenizer.json` path.
    pub fn from_spec(spec: &str) -> Result<Self> {
        if spec == "bytes" {
            return Ok(Tokenizer::Bytes);
        }
        Self::from_file(Path::new(spec))
    }

    /// Loads a Hugging Face `tokenizer.json`; the file must define an end-of-text token.
    ///
    /// The loaded tokenizer is set up for documents, whatever the file says:
    /// * special added tokens (`"special": true`, e.g. `<|end_of_text|>`) written in a document's
    ///   text are encoded as ordinary text, never as their special id (tiktoken's
    ///   `encode_ordinary`): a web page quoting `<|end_of_text|>` must not end the document;
    /// * `truncation` and `padding` are switched off (with a warning when the file set them): the
    ///   pipeline never truncates or pads a document.
    pub fn from_file(path: &Path) -> Result<Self> {
        let err = |problem: String| DataError::Tokenizer {
            path: path.to_path_buf(),
            problem,
        };
        let text = std::fs::read(path).map_err(|e| err(format!("cannot read: {e}")))?;
        let mut inner = tokenizers::Tokenizer::from_bytes(&text)
            .map_err(|e| err(format!("not a valid tokenizer.json: {e}")))?;
        let eos = EOS_NAMES
            .iter()
            .find_map(|n| inner.token_to_id(n))
            .ok_or_else(|| {
                err(format!(
                    "defines no end-of-text token (looked for {})",
                    EOS_NAMES.join(", ")
                ))
            })?;
        let bos = BOS_NAMES.iter().find_map(|n| inner.token_to_id(n));
        if let Some(t) = inner.get_truncation() {
            tracing::warn!(
                "{}: ignoring the file's `truncation` (max_length {}): documents are never truncated",
                path.display(),
                t.max_length
            );
        }
        if let Some(p) = inner.get_padding() {
            tracing::warn!(
                "{}: ignoring the file's `padding` ({:?}): documents are never padded",
                path.display(),
                p.strategy
            );
        }
        inner
            .with_truncation(None)
            .map_err(|e| err(format!("cannot switch truncation off: {e}")))?;
        inner.with_padding(None);
        inner.set_encode_special_tokens(true);
        let added = inner.get_added_tokens_decoder();
        for id in std::iter::once(eos).chain(bos) {
            if let Some(t) = added.get(&id).filter(|t| !t.special) {
                tracing::warn!(
                    "{}: added token {:?} (id {id}) is not marked \"special\": the same text inside a document still encodes to it",
                    path.display(),
                    t.content
                );
            }
        }
        // Ids need not be contiguous (cl100k-style files leave gaps): the model must embed every
        // id up to the largest, not just as many rows as there are distinct tokens.
        let vocab = inner
            .get_vocab(true)
            .values()
            .max()
            .map_or(0, |&m| m as usize + 1)
            .max(eos as usize + 1);
        Ok(Tokenizer::Hf {
            path: path.to_path_buf(),
            inner: Box::new(inner),
            eos,
            bos,
            vocab,
        })
    }

    /// Ids the model must embed: bytes + specials, or for a `tokenizer.json` the largest id of its
    /// vocabulary and added tokens plus one (ids left unused by gaps included).
    pub fn vocab_size(&self) -> usize {
        match self {
            Tokenizer::Bytes => 256 + BYTE_SPECIALS.len(),
            Tokenizer::Hf { vocab, .. } => *vocab,
        }
    }

    /// The end-of-text id appended to every document.
    pub fn eos_id(&self) -> u32 {
        match self {
            Tokenizer::Bytes => 256,
            Tokenizer::Hf { eos, .. } => *eos,
        }
    }

    /// The beginning-of-text id put before every document, if the tokenizer has one (the byte
    /// tokenizer's is 257; a `tokenizer.json`'s is the first of [`BOS_NAMES`] it defines).
    pub fn bos_id(&self) -> Option<u32> {
        match self {
            Tokenizer::Bytes => Some(257),
            Tokenizer::Hf { bos, .. } => *bos,
        }
    }

    /// The spelling of token `id` (specials by name), if it exists.
    pub fn token_name(&self, id: u32) -> Option<String> {
        match self {
            Tokenizer::Bytes if id >= 256 => BYTE_SPECIALS.get(id as usize - 256).map(|s| s.to_string()),
            Tokenizer::Bytes => None,
            Tokenizer::Hf { inner, .. } => inner.id_to_token(id),
        }
    }

    /// How the tokenizer is named on command lines and in configs: `bytes` or the
    /// `tokenizer.json` path.
    pub fn spec(&self) -> String {
        match self {
            Tokenizer::Bytes => "bytes".into(),
            Tokenizer::Hf { path, .. } => path.display().to_string(),
        }
    }

    /// The `tokenizer.json` `flamia export` writes for transformers and lm-evaluation-harness: the
    /// file as given (for the byte tokenizer its equivalent, [`byte_tokenizer_json`]) with
    /// `truncation` and `padding` off (flamia never truncates or pads a document) and the
    /// post-processor of [`document_post_processor`]: with `add_special_tokens=True` (the
    /// transformers default) an encoding starts with BOS, as every training document did.
    /// flamia itself encodes without special tokens, so loading the exported file here encodes
    /// every text to the same ids as this tokenizer.
    pub fn export_json(&self) -> Result<serde_json::Value> {
        let mut v = match self {
            Tokenizer::Bytes => byte_tokenizer_json(),
            Tokenizer::Hf { path, .. } => {
                let err = |problem: String| DataError::Tokenizer {
                    path: path.clone(),
                    problem,
                };
                let text = std::fs::read(path).map_err(|e| err(format!("cannot read: {e}")))?;
                serde_json::from_slice(&text).map_err(|e| err(format!("not valid JSON: {e}")))?
            }
        };
        let Some(obj) = v.as_object_mut() else {
            return Err(DataError::Tokenizer {
                path: self.spec().into(),
                problem: "is not a JSON object".into(),
            });
        };
        obj.insert("truncation".into(), serde_json::Value::Null);
        obj.insert("padding".into(), serde_json::Value::Null);
        let existing = obj.remove("post_processor").unwrap_or(serde_json::Value::Null);
        let bos = match self.bos_id() {
            Some(id) => Some((
                self.token_name(id).ok_or_else(|| DataError::Tokenizer {
                    path: self.spec().into(),
                    problem: format!("BOS id {id} has no token"),
                })?,
                id,
            )),
            None => None,
        };
        obj.insert(
            "post_processor".into(),
            document_post_processor(existing, bos.as_ref().map(|(n, id)| (n.as_str(), *id))),
        );
        Ok(v)
    }

    /// A short identity used to check pre-tokenised shards and saved data states against the
    /// configured tokenizer. A `tokenizer.json`'s starts with [`HF_FINGERPRINT_TAG`], which
    /// changes whenever this crate encodes the same file differently.
    pub fn fingerprint(&self) -> String {
        match self {
            Tokenizer::Bytes => "bytes".into(),
            Tokenizer::Hf {
                inner, vocab, eos, ..
            } => {
                // The serialised model decides the ids (BOS included); hash it rather than trusting
                // the path.
                let json = inner.to_string(false).unwrap_or_default();
                format!(
                    "{HF_FINGERPRINT_TAG}:{vocab}:{eos}:{:016x}",
                    fnv1a(json.as_bytes())
                )
            }
        }
    }

    /// Token ids of `text` without special tokens (the pipeline adds BOS and end-of-text itself).
    /// Special-token names inside `text` are encoded as the text they are.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        match self {
            Tokenizer::Bytes => Ok(text.bytes().map(u32::from).collect()),
            Tokenizer::Hf { inner, path, .. } => inner
                .encode_fast(text, false)
                .map(|e| e.get_ids().to_vec())
                .map_err(|e| DataError::Tokenizer {
                    path: path.clone(),
                    problem: format!("encode failed: {e}"),
                }),
        }
    }

    /// Text of `ids` (specials spelled out by the byte tokenizer, invalid UTF-8 replaced).
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        match self {
            Tokenizer::Bytes => {
                let mut out = Vec::with_capacity(ids.len());
                for &i in ids {
                    match i {
                        0..=255 => out.push(i as u8),
                        _ => {
                            let name = BYTE_SPECIALS.get(i as usize - 256).copied().unwrap_or("<|unk|>");
                            out.extend_from_slice(name.as_bytes());
                        }
                    }
                }
                Ok(String::from_utf8_lossy(&out).into_owned())
            }
            Tokenizer::Hf { inner, path, .. } => inner.decode(ids, false).map_err(|e| DataError::Tokenizer {
                path: path.clone(),
                problem: format!("decode failed: {e}"),
            }),
        }
    }
}

/// A Hugging Face `tokenizer.json` equivalent to the byte tokenizer (byte `b` = id `b`,
/// `<|end_of_text|>` = 256, `<|begin_of_text|>` = 257): byte-level BPE over the 256 bytes with no
/// merges. `flamia export` writes it (with a BOS post-processor: [`Tokenizer::export_json`]) so
/// transformers can load byte-level models.
pub fn byte_tokenizer_json() -> serde_json::Value {
    let ranks: Vec<(Vec<u8>, u32)> = (0..=255u8).map(|b| (vec![b], u32::from(b))).collect();
    let specials: Vec<String> = BYTE_SPECIALS.iter().map(|s| s.to_string()).collect();
    crate::tiktoken::tokenizer_json(&ranks, crate::tiktoken::LLAMA3_PATTERN, &specials)
}

/// Post-processor types that add special tokens around an encoding.
const SPECIAL_ADDING_PROCESSORS: [&str; 3] = ["TemplateProcessing", "BertProcessing", "RobertaProcessing"];

/// The post-processor of an exported `tokenizer.json`, from the file's `existing` one: its
/// processors that add special tokens (`TemplateProcessing`, `BertProcessing`,
/// `RobertaProcessing`) are dropped and the rest kept (Llama-3's `ByteLevel`, which only adjusts
/// offsets); with a BOS (`(name, id)`) a `TemplateProcessing` is appended that puts it before
/// every sequence, as Llama-3's `tokenizer.json` does (single: `BOS $A`, pair: `BOS $A BOS $B`,
/// the second half with type id 1). So transformers adds exactly what flamia's training added
/// before a document: BOS when the tokenizer has one, nothing otherwise. Several processors are
/// combined in a `Sequence`; none gives `null`.
pub fn document_post_processor(existing: serde_json::Value, bos: Option<(&str, u32)>) -> serde_json::Value {
    use serde_json::{json, Value};
    let mut parts: Vec<Value> = match existing {
        Value::Null => Vec::new(),
        Value::Object(ref o) if o.get("type").and_then(Value::as_str) == Some("Sequence") => o
            .get("processors")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default(),
        other => vec![other],
    };
    parts.retain(|p| {
        !p.get("type")
            .and_then(Value::as_str)
            .is_some_and(|t| SPECIAL_ADDING_PROCESSORS.contains(&t))
    });
    if let Some((name, id)) = bos {
        let special = |type_id: u32| json!({"SpecialToken": {"id": name, "type_id": type_id}});
        let seq = |s: &str, type_id: u32| json!({"Sequence": {"id": s, "type_id": type_id}});
        parts.push(json!({
            "type": "TemplateProcessing",
            "single": [special(0), seq("A", 0)],
            "pair": [special(0), seq("A", 0), special(1), seq("B", 1)],
            "special_tokens": {name: {"id": name, "ids": [id], "tokens": [name]}},
        }));
    }
    match parts.len() {
        0 => Value::Null,
        1 => parts.pop().unwrap_or(Value::Null),
        _ => json!({"type": "Sequence", "processors": parts}),
    }
}

/// 64-bit FNV-1a, a stable hash for fingerprints and seeds (not for security).
pub fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_round_trip_and_specials() {
        let t = Tokenizer::Bytes;
        let ids = t.encode("héllo").unwrap();
        assert_eq!(ids.len(), 6);
        assert_eq!(t.decode(&ids).unwrap(), "héllo");
        assert_eq!(t.vocab_size(), 258);
        assert_eq!(t.decode(&[104, 256]).unwrap(), "h<|end_of_text|>");
        assert_eq!((t.bos_id(), t.eos_id()), (Some(257), 256));
        assert_eq!(t.token_name(257).as_deref(), Some("<|begin_of_text|>"));
    }

    #[test]
    fn byte_tokenizer_json_encodes_like_the_byte_tokenizer() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("tokenizer.json");
        std::fs::write(&p, byte_tokenizer_json().to_string()).unwrap();
        let hf = Tokenizer::from_file(&p).unwrap();
        assert_eq!((hf.vocab_size(), hf.eos_id(), hf.bos_id()), (258, 256, Some(257)));
        for text in ["héllo, wörld!\n\tça va? 東京 🦀", "  two  spaces\r\n"] {
            let want = Tokenizer::Bytes.encode(text).unwrap();
            let got = hf.encode(text).unwrap();
            assert_eq!(got, want, "{text:?}");
            assert_eq!(hf.decode(&got).unwrap(), text);
        }
    }

    fn load(dir: &Path, name: &str, v: &serde_json::Value) -> Tokenizer {
        let p = dir.join(name);
        std::fs::write(&p, v.to_string()).unwrap();
        Tokenizer::from_file(&p).unwrap()
    }

    #[test]
    fn special_token_names_in_document_text_are_plain_text() {
        let dir = tempfile::tempdir().unwrap();
        let hf = load(dir.path(), "tokenizer.json", &byte_tokenizer_json());
        for text in [
            "a web page quoting <|end_of_text|> mid-document",
            "<|begin_of_text|>starts like a BOS",
            "<|end_of_text|>",
        ] {
            let ids = hf.encode(text).unwrap();
            assert!(
                !ids.contains(&hf.eos_id()) && !ids.contains(&257),
                "special id inside the document {text:?}: {ids:?}"
            );
            assert_eq!(ids, Tokenizer::Bytes.encode(text).unwrap(), "{text:?}");
            assert_eq!(hf.decode(&ids).unwrap(), text);
        }
    }

    #[test]
    fn the_fingerprint_differs_from_the_version_that_encoded_specials_in_text() {
        let dir = tempfile::tempdir().unwrap();
        let hf = load(dir.path(), "tokenizer.json", &byte_tokenizer_json());
        let Tokenizer::Hf { inner, .. } = &hf else {
            panic!("expected a HF tokenizer")
        };
        // Exactly what version 1 (special-token text encoded as special ids) wrote.
        let v1 = format!(
            "hf:{}:{}:{:016x}",
            hf.vocab_size(),
            hf.eos_id(),
            fnv1a(inner.to_string(false).unwrap().as_bytes())
        );
        let fp = hf.fingerprint();
        assert_ne!(fp, v1);
        assert!(fp.starts_with(&format!("{HF_FINGERPRINT_TAG}:")), "{fp}");
    }

    #[test]
    fn truncation_and_padding_of_the_file_are_switched_off() {
        let dir = tempfile::tempdir().unwrap();
        let mut v = byte_tokenizer_json();
        v["truncation"] = serde_json::json!({
            "direction": "Right", "max_length": 4, "strategy": "LongestFirst", "stride": 0
        });
        v["padding"] = serde_json::json!({
            "strategy": {"Fixed": 64}, "direction": "Right", "pad_to_multiple_of": null,
            "pad_id": 256, "pad_type_id": 0, "pad_token": "<|end_of_text|>"
        });
        // The file really asks for both (the tokenizers crate parsed them).
        let raw = tokenizers::Tokenizer::from_bytes(v.to_string().as_bytes()).unwrap();
        assert!(raw.get_truncation().is_some() && raw.get_padding().is_some());
        let text = "a document longer than four tokens";
        assert_eq!(raw.encode_fast(text, false).unwrap().get_ids().len(), 64);
        let hf = load(dir.path(), "tokenizer.json", &v);
        assert_eq!(hf.encode(text).unwrap(), Tokenizer::Bytes.encode(text).unwrap());
    }

    #[test]
    fn vocab_size_covers_the_largest_id_when_ids_have_gaps() {
        let dir = tempfile::tempdir().unwrap();
        // Bytes 0..=255, then `ab` at 300: ids 256..=299 are unused by the model. (The tokenizers
        // crate numbers added tokens from the model's token count on, so end-of-text lands at 257
        // whatever id the file gives it.)
        let mut ranks: Vec<(Vec<u8>, u32)> = (0..=255u8).map(|b| (vec![b], u32::from(b))).collect();
        ranks.push((b"ab".to_vec(), 300));
        let v = crate::tiktoken::tokenizer_json(
            &ranks,
            crate::tiktoken::LLAMA3_PATTERN,
            &["<|end_of_text|>".to_string()],
        );
        let hf = load(dir.path(), "gaps.json", &v);
        let Tokenizer::Hf { inner, .. } = &hf else {
            panic!("expected a HF tokenizer")
        };
        assert_eq!(inner.get_vocab_size(true), 258, "distinct tokens");
        assert_eq!(hf.encode("ab").unwrap(), vec![300]);
        assert_eq!(
            hf.vocab_size(),
            301,
            "every id up to 300 must have an embedding row"
        );
        assert!(hf.eos_id() < 301);
    }

    #[test]
    fn invalid_tokenizer_file_names_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("tok.json");
        std::fs::write(&p, "{not json").unwrap();
        let e = Tokenizer::from_file(&p).unwrap_err().to_string();
        assert!(
            e.contains("tok.json") && e.contains("not a valid tokenizer.json"),
            "{e}"
        );
        let e = Tokenizer::from_spec(dir.path().join("missing.json").to_str().unwrap()).unwrap_err();
        assert!(e.to_string().contains("missing.json"), "{e}");
    }
}
