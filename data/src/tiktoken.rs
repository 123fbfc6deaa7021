//! `flamia tokenizer convert-tiktoken`: turn a tiktoken rank file (`base64(token) rank` per line,
//! e.g. Llama-3's `tokenizer.model` shipped by the `llama-models` PyPI package) into a Hugging Face
//! `tokenizer.json`: byte-level BPE whose vocabulary is the ranks, whose merges are derived from
//! the ranks (for every token, each split into two tokens, ordered by the merged token's rank), the
//! Llama-3 pre-tokenisation regex, and Llama-3's 256 special tokens after the base vocabulary.

use std::collections::HashMap;
use std::path::Path;

use serde_json::{json, Value};

use crate::error::{DataError, Result};

/// The Llama-3 (and cl100k) pre-tokenisation pattern.
pub const LLAMA3_PATTERN: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Special tokens Llama 3.x defines after the base vocabulary (then reserved ones up to 256).
pub const LLAMA3_SPECIALS: [&str; 12] = [
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|reserved_special_token_0|>",
    "<|reserved_special_token_1|>",
    "<|finetune_right_pad_id|>",
    "<|step_id|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eom_id|>",
    "<|eot_id|>",
    "<|python_tag|>",
    "<|image|>",
];

/// Number of Llama-3 special token ids.
pub const LLAMA3_NUM_SPECIALS: usize = 256;

/// The 256 Llama-3 special token names in id order.
pub fn llama3_specials() -> Vec<String> {
    let mut v: Vec<String> = LLAMA3_SPECIALS.iter().map(|s| s.to_string()).collect();
    for i in 0..LLAMA3_NUM_SPECIALS - LLAMA3_SPECIALS.len() {
        v.push(format!("<|reserved_special_token_{}|>", 2 + i));
    }
    v
}

/// The pattern called `name` (`llama3`), or a literal regex given as `regex:<pattern>`.
pub fn pattern(name: &str) -> Result<String> {
    match name {
        "llama3" | "cl100k" => Ok(LLAMA3_PATTERN.into()),
        _ => name.strip_prefix("regex:").map(str::to_string).ok_or_else(|| {
            DataError::Config(format!(
                "unknown pattern `{name}`: use `llama3` or `regex:<pattern>`"
            ))
        }),
    }
}

/// GPT-2's reversible map from bytes to printable characters used by byte-level BPE.
pub fn bytes_to_unicode() -> [char; 256] {
    let mut map = ['\0'; 256];
    let mut n = 0u32;
    for b in 0..256u32 {
        let printable = (33..=126).contains(&b) || (161..=172).contains(&b) || (174..=255).contains(&b);
        map[b as usize] = if printable {
            char::from_u32(b).unwrap_or('?')
        } else {
            n += 1;
            char::from_u32(255 + n).unwrap_or('?')
        };
    }
    map
}

fn byte_string(bytes: &[u8], map: &[char; 256]) -> String {
    bytes.iter().map(|&b| map[b as usize]).collect()
}

fn b64_decode(s: &str) -> Option<Vec<u8>> {
    let val = |c: u8| -> Option<u32> {
        Some(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        } as u32)
    };
    let s = s.trim_end_matches('=').as_bytes();
    let mut out = Vec::with_capacity(s.len() * 3 / 4);
    for chunk in s.chunks(4) {
        let mut acc = 0u32;
        for (i, &c) in chunk.iter().enumerate() {
            acc |= val(c)? << (18 - 6 * i);
        }
        let n = match chunk.len() {
            4 => 3,
            3 => 2,
            2 => 1,
            _ => return None,
        };
        out.extend_from_slice(&acc.to_be_bytes()[1..1 + n]);
    }
    Some(out)
}

/// Base64 encoding (for writing rank files in tests and tools).
pub fn b64_encode(bytes: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for c in bytes.chunks(3) {
        let acc = (u32::from(c[0]) << 16)
            | (u32::from(*c.get(1).unwrap_or(&0)) << 8)
            | u32::from(*c.get(2).unwrap_or(&0));
        for i in 0..4 {
            if i <= c.len() {
                out.push(A[((acc >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// Reads a tiktoken rank file into `(token bytes, rank)` sorted by rank. Ranks must be unique and
/// every single byte must be a token.
pub fn read_ranks(path: &Path) -> Result<Vec<(Vec<u8>, u32)>> {
    let bad = |problem: String| DataError::Input {
        path: path.into(),
        problem,
    };
    let text = std::fs::read_to_string(path).map_err(|e| bad(format!("cannot read: {e}")))?;
    let mut ranks = Vec::new();
    for (i, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let mut it = line.split_whitespace();
        let (Some(tok), Some(rank), None) = (it.next(), it.next(), it.next()) else {
            return Err(bad(format!("line {}: expected `<base64 token> <rank>`", i + 1)));
        };
        let tok = b64_decode(tok).ok_or_else(|| bad(format!("line {}: `{tok}` is not base64", i + 1)))?;
        let rank: u32 = rank
            .parse()
            .map_err(|_| bad(format!("line {}: rank `{rank}` is not an integer", i + 1)))?;
        ranks.push((tok, rank));
    }
    ranks.sort_by_key(|r| r.1);
    if ranks.windows(2).any(|w| w[0].1 == w[1].1) {
        return Err(bad("duplicate rank".into()));
    }
    let singles = ranks.iter().filter(|r| r.0.len() == 1).count();
    if singles != 256 {
        return Err(bad(format!(
            "{singles} single-byte tokens, but byte-level BPE needs all 256"
        )));
    }
    Ok(ranks)
}

/// Builds the `tokenizer.json` value from ranks, a pre-tokenisation regex and special tokens
/// (ids `max rank + 1 ..`).
pub fn tokenizer_json(ranks: &[(Vec<u8>, u32)], pattern: &str, specials: &[String]) -> Value {
    let map = bytes_to_unicode();
    let by_bytes: HashMap<&[u8], u32> = ranks.iter().map(|(b, r)| (b.as_slice(), *r)).collect();
    let mut vocab = serde_json::Map::new();
    let mut merges: Vec<(u32, u32, u32, String, String)> = Vec::new();
    for (tok, rank) in ranks {
        vocab.insert(byte_string(tok, &map), json!(rank));
        for i in 1..tok.len() {
            let (l, r) = tok.split_at(i);
            if let (Some(&rl), Some(&rr)) = (by_bytes.get(l), by_bytes.get(r)) {
                merges.push((*rank, rl, rr, byte_string(l, &map), byte_string(r, &map)));
            }
        }
    }
    // Priority = rank of the merged token, then of its pieces (what HF's tiktoken converter does).
    merges.sort_by_key(|m| (m.0, m.1, m.2));
    let merges: Vec<Value> = merges.into_iter().map(|m| json!([m.3, m.4])).collect();
    let base = ranks.iter().map(|r| r.1).max().map_or(0, |m| m + 1);
    let added: Vec<Value> = specials
        .iter()
        .enumerate()
        .map(|(i, s)| {
            json!({"id": base + i as u32, "content": s, "single_word": false, "lstrip": false,
                   "rstrip": false, "normalized": false, "special": true})
        })
        .collect();
    json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": false},
            {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false}
        ]},
        "post_processor": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": false, "use_regex": true},
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
                  "ignore_merges": true, "vocab": vocab, "merges": merges}
    })
}

/// Converts a rank file into `out` and checks the result loads before it replaces `out` (written
/// as `out.tmp`, renamed into place: [`crate::atomic`]); returns the vocabulary size (base +
/// specials).
pub fn convert(ranks_path: &Path, pattern_name: &str, out: &Path) -> Result<usize> {
    use std::io::Write;
    let ranks = read_ranks(ranks_path)?;
    let pat = pattern(pattern_name)?;
    let specials = llama3_specials();
    let value = tokenizer_json(&ranks, &pat, &specials);
    let werr = |e: String| DataError::Write {
        path: out.into(),
        problem: e,
    };
    let text = serde_json::to_string(&value).map_err(|e| werr(e.to_string()))?;
    let (staged, mut file) = crate::atomic::Staged::create(out)?;
    file.write_all(text.as_bytes()).map_err(|e| werr(e.to_string()))?;
    let tok = crate::Tokenizer::from_file(&crate::atomic::temp_path(out))?;
    staged.commit(file)?;
    Ok(tok.vocab_size())
}

/// tiktoken's own BPE on one pre-tokenised piece: merge the adjacent pair whose concatenation has
/// the lowest rank until none is a token. The reference the converted tokenizer must reproduce.
pub fn tiktoken_encode_piece(piece: &[u8], ranks: &HashMap<Vec<u8>, u32>) -> Vec<u32> {
    if let Some(&r) = ranks.get(piece) {
        return vec![r];
    }
    let mut parts: Vec<Vec<u8>> = piece.iter().map(|&b| vec![b]).collect();
    loop {
        let best = (0..parts.len().saturating_sub(1))
            .filter_map(|i| {
                ranks
                    .get(&[parts[i].as_slice(), parts[i + 1].as_slice()].concat())
                    .map(|&r| (r, i))
            })
            .min();
        let Some((_, i)) = best else { break };
        let right = parts.remove(i + 1);
        parts[i].extend_from_slice(&right);
    }
    parts.iter().filter_map(|p| ranks.get(p).copied()).collect()
}
