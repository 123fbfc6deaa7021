//! The `tokenizer.json` `flamia export` writes ([`Tokenizer::export_json`]): with special tokens
//! (transformers' default) the Hugging Face tokenizer puts BOS before every sequence, as training
//! put it before every document, and nothing when the tokenizer has no BOS; without them, and in
//! flamia (which never adds special tokens), the ids are the original tokenizer's.

use std::path::{Path, PathBuf};

use flamia_data::tiktoken::{b64_encode, convert};
use flamia_data::Tokenizer;
use serde_json::{json, Value};

const TEXTS: [&str; 3] = [
    "in the heath, the other",
    "  spaces\tand\nnew lines 12345",
    "héllo wörld 東京",
];

/// Special-token names inside a document: flamia encodes them as text (the `tokenizers` crate,
/// like transformers by default, as special ids), so only flamia's encodings are compared.
const SPECIAL_TEXT: &str = "a page quoting <|begin_of_text|> and <|end_of_text|>";

/// A Llama-3-style tokenizer.json (bytes, merges " t", "he", " the"; BOS `<|begin_of_text|>` =
/// 259, EOS = 260).
fn llama3_style(dir: &Path) -> PathBuf {
    let mut ranks = String::new();
    for b in 0..=255u8 {
        ranks.push_str(&format!("{} {b}\n", b64_encode(&[b])));
    }
    for (i, t) in [&b" t"[..], b"he", b" the"].iter().enumerate() {
        ranks.push_str(&format!("{} {}\n", b64_encode(t), 256 + i));
    }
    let rank_file = dir.join("tiny.tiktoken");
    std::fs::write(&rank_file, ranks).unwrap();
    // Not called tokenizer.json: the export writes it under that name whatever this one is.
    let p = dir.join("llama3.json");
    convert(&rank_file, "llama3", &p).unwrap();
    p
}

fn write(dir: &Path, name: &str, v: &Value) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, v.to_string()).unwrap();
    p
}

/// The exported file loaded by the `tokenizers` crate (what transformers' fast tokenizer runs).
fn hf(v: &Value) -> tokenizers::Tokenizer {
    tokenizers::Tokenizer::from_bytes(v.to_string().as_bytes()).unwrap()
}

/// Checks the exported `v` against the original `tok`: BOS (if any) before every sequence with
/// special tokens, the original ids without, and flamia's own encoding unchanged.
fn check(dir: &Path, tok: &Tokenizer, v: &Value) {
    let h = hf(v);
    let bos: Vec<u32> = tok.bos_id().into_iter().collect();
    for text in TEXTS {
        let ids = tok.encode(text).unwrap();
        let plain = h.encode(text, false).unwrap();
        assert_eq!(plain.get_ids(), &ids[..], "{text:?} without special tokens");
        let with = h.encode(text, true).unwrap();
        assert_eq!(with.get_ids(), &[&bos[..], &ids[..]].concat()[..], "{text:?}");
        // A pair (lm-eval encodes context and continuation apart; a pair is BOS A BOS B).
        let b = "the end";
        let pair = h.encode((text, b), true).unwrap();
        let b_ids = tok.encode(b).unwrap();
        assert_eq!(
            pair.get_ids(),
            &[&bos[..], &ids[..], &bos[..], &b_ids[..]].concat()[..],
            "{text:?} + {b:?}"
        );
        assert_eq!(pair.get_type_ids().last(), Some(&1));
    }
    // flamia loading the exported file: same ids (never special tokens), ids and vocabulary.
    let exported = Tokenizer::from_file(&write(dir, "exported.json", v)).unwrap();
    for text in TEXTS.into_iter().chain([SPECIAL_TEXT]) {
        assert_eq!(
            exported.encode(text).unwrap(),
            tok.encode(text).unwrap(),
            "{text:?}"
        );
    }
    assert_eq!(
        (exported.bos_id(), exported.eos_id(), exported.vocab_size()),
        (tok.bos_id(), tok.eos_id(), tok.vocab_size())
    );
}

#[test]
fn a_llama3_style_export_adds_bos_like_llama3() {
    let dir = tempfile::tempdir().unwrap();
    let tok = Tokenizer::from_file(&llama3_style(dir.path())).unwrap();
    assert_eq!((tok.bos_id(), tok.eos_id()), (Some(259), 260));
    let v = tok.export_json().unwrap();
    // Llama-3's own layout: ByteLevel (offsets) then the BOS template.
    let pp = &v["post_processor"];
    assert_eq!(pp["type"], "Sequence");
    assert_eq!(pp["processors"][0]["type"], "ByteLevel");
    assert_eq!(pp["processors"][1]["type"], "TemplateProcessing");
    assert_eq!(
        pp["processors"][1]["special_tokens"]["<|begin_of_text|>"]["ids"],
        json!([259])
    );
    check(dir.path(), &tok, &v);
    // The original file is not changed: only the exported copy adds BOS.
    let orig = tokenizers::Tokenizer::from_file(llama3_style(dir.path())).unwrap();
    assert_eq!(
        orig.encode("the", true).unwrap().get_ids(),
        tok.encode("the").unwrap()
    );
}

#[test]
fn the_byte_tokenizer_export_adds_its_bos() {
    let dir = tempfile::tempdir().unwrap();
    let v = Tokenizer::Bytes.export_json().unwrap();
    assert_eq!(hf(&v).encode("hé", true).unwrap().get_ids(), [257, 104, 195, 169]);
    check(dir.path(), &Tokenizer::Bytes, &v);
}

#[test]
fn a_tokenizer_without_bos_exports_without_added_tokens() {
    let dir = tempfile::tempdir().unwrap();
    // GPT-2 style: only an end-of-text token; the file's own template appends it, which flamia
    // never trained with (documents end with it, but an encoding of a context does not).
    let ranks: Vec<(Vec<u8>, u32)> = (0..=255u8).map(|b| (vec![b], u32::from(b))).collect();
    let mut v = flamia_data::tiktoken::tokenizer_json(
        &ranks,
        flamia_data::tiktoken::LLAMA3_PATTERN,
        &["<|endoftext|>".to_string()],
    );
    v["post_processor"] = json!({
        "type": "TemplateProcessing",
        "single": [{"Sequence": {"id": "A", "type_id": 0}}, {"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}}],
        "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {"<|endoftext|>": {"id": "<|endoftext|>", "ids": [256], "tokens": ["<|endoftext|>"]}}
    });
    v["truncation"] = json!({"direction": "Right", "max_length": 4, "strategy": "LongestFirst", "stride": 0});
    let tok = Tokenizer::from_file(&write(dir.path(), "gpt2.json", &v)).unwrap();
    assert_eq!(tok.bos_id(), None);
    let e = tok.export_json().unwrap();
    assert_eq!(e["post_processor"], json!(null));
    assert_eq!(
        e["truncation"],
        json!(null),
        "flamia never truncates; nor does the export"
    );
    for text in TEXTS {
        let ids = tok.encode(text).unwrap();
        assert_eq!(hf(&e).encode(text, true).unwrap().get_ids(), &ids[..], "{text:?}");
    }
    let exported = Tokenizer::from_file(&write(dir.path(), "exported.json", &e)).unwrap();
    assert_eq!(exported.encode(TEXTS[0]).unwrap(), tok.encode(TEXTS[0]).unwrap());
}

#[test]
fn document_post_processor_replaces_templates_and_keeps_the_rest() {
    use flamia_data::tokenizer::document_post_processor;
    let byte_level =
        json!({"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": false, "use_regex": true});
    let template = |ids: Value| json!({"type": "TemplateProcessing", "single": [], "pair": [], "special_tokens": {"x": {"id": "x", "ids": ids, "tokens": ["x"]}}});
    // An existing BOS template (a Llama-3 file) is replaced, not doubled.
    let existing = json!({"type": "Sequence", "processors": [byte_level.clone(), template(json!([9]))]});
    let got = document_post_processor(existing, Some(("<s>", 1)));
    let procs = got["processors"].as_array().unwrap();
    assert_eq!(procs.len(), 2);
    assert_eq!(procs[0], byte_level);
    assert_eq!(procs[1]["special_tokens"]["<s>"]["ids"], json!([1]));
    // A lone template with BOS: just ours. Nothing and no BOS: null.
    let got = document_post_processor(template(json!([2])), Some(("<s>", 1)));
    assert_eq!(got["type"], "TemplateProcessing");
    assert_eq!(got["single"][0]["SpecialToken"]["id"], "<s>");
    assert_eq!(document_post_processor(Value::Null, None), Value::Null);
    assert_eq!(document_post_processor(byte_level.clone(), None), byte_level);
}
