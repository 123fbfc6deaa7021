//! tiktoken -> tokenizer.json conversion on a small rank file trained here: ids equal tiktoken's
//! own BPE on every pre-tokenised piece, text round-trips, Llama-3 specials follow the base vocab.

use std::collections::HashMap;

use flamia_data::tiktoken::{b64_encode, convert, tiktoken_encode_piece, LLAMA3_PATTERN};
use flamia_data::Tokenizer;
use tokenizers::{OffsetReferential, OffsetType, PreTokenizedString, PreTokenizer};

const CORPUS: &str = "The quick brown fox jumps over the lazy dog. The dog sleeps; the fox runs \
    into the forest, where the other foxes are. Theory: the thesis then thereafter. 12345 apples \
    and 678 oranges! It's what they'll do, isn't it? We've seen   spaces\tand\ttabs\n\nnew lines.";

/// A tiktoken-style rank file: bytes 0..=255 first, then `merges` greedy BPE merges (most frequent
/// adjacent pair within whitespace-led words), each new token's rank after all before it.
fn train_ranks(merges: usize) -> Vec<(Vec<u8>, u32)> {
    let mut ranks: Vec<(Vec<u8>, u32)> = (0..=255u8).map(|b| (vec![b], u32::from(b))).collect();
    let mut words: Vec<Vec<Vec<u8>>> = Vec::new();
    let mut cur = String::new();
    for ch in CORPUS.chars() {
        if ch.is_whitespace() && !cur.is_empty() {
            words.push(cur.bytes().map(|b| vec![b]).collect());
            cur.clear();
        }
        cur.push(ch);
    }
    words.push(cur.bytes().map(|b| vec![b]).collect());
    for _ in 0..merges {
        let mut counts: HashMap<(Vec<u8>, Vec<u8>), usize> = HashMap::new();
        for w in &words {
            for p in w.windows(2) {
                *counts.entry((p[0].clone(), p[1].clone())).or_default() += 1;
            }
        }
        let Some(((a, b), _)) = counts
            .into_iter()
            .max_by(|x, y| x.1.cmp(&y.1).then(y.0.cmp(&x.0)))
        else {
            break;
        };
        let merged = [a.clone(), b.clone()].concat();
        if ranks.iter().any(|r| r.0 == merged) {
            break;
        }
        ranks.push((merged.clone(), ranks.len() as u32));
        for w in &mut words {
            let mut i = 0;
            while i + 1 < w.len() {
                if w[i] == a && w[i + 1] == b {
                    w[i] = merged.clone();
                    w.remove(i + 1);
                }
                i += 1;
            }
        }
    }
    ranks
}

#[test]
fn converted_tokenizer_reproduces_tiktoken_ranks() {
    let ranks = train_ranks(120);
    assert!(ranks.len() > 330, "trained {} tokens", ranks.len());
    let dir = tempfile::tempdir().unwrap();
    let rank_file = dir.path().join("tiny.tiktoken");
    let mut text = String::new();
    // Shuffled line order: the converter must sort by rank itself.
    for (t, r) in ranks.iter().rev() {
        text.push_str(&format!("{} {r}\n", b64_encode(t)));
    }
    std::fs::write(&rank_file, text).unwrap();
    let out = dir.path().join("tokenizer.json");
    let vocab = convert(&rank_file, "llama3", &out).unwrap();
    assert_eq!(vocab, ranks.len() + 256);

    let tok = Tokenizer::from_file(&out).unwrap();
    let base = ranks.len() as u32;
    assert_eq!(tok.eos_id(), base + 1, "<|end_of_text|> is the second special");
    let Tokenizer::Hf { inner, .. } = &tok else {
        panic!("expected a HF tokenizer")
    };
    assert_eq!(inner.token_to_id("<|begin_of_text|>"), Some(base));
    assert_eq!(inner.token_to_id("<|eot_id|>"), Some(base + 9));
    assert_eq!(
        inner.token_to_id("<|reserved_special_token_245|>"),
        Some(base + 255)
    );

    let by_bytes: HashMap<Vec<u8>, u32> = ranks.iter().cloned().collect();
    let pre = inner.get_pre_tokenizer().expect("pre-tokenizer");
    let samples = [
        CORPUS,
        "the fox, the foxes and theories: 2024 was 1999+25!",
        "  Unseen wörds — ünïcödé ✓ and emoji 🦀\r\n\ttabs",
        "It's they'll'VE shouted THE FOX",
    ];
    for s in samples {
        let ids = tok.encode(s).unwrap();
        assert_eq!(tok.decode(&ids).unwrap(), s, "round trip");
        let mut pts = PreTokenizedString::from(s);
        pre.pre_tokenize(&mut pts).unwrap();
        let mut want = Vec::new();
        for (_, (a, b), _) in pts.get_splits(OffsetReferential::Original, OffsetType::Byte) {
            want.extend(tiktoken_encode_piece(&s.as_bytes()[a..b], &by_bytes));
        }
        assert_eq!(ids, want, "ids differ from tiktoken's BPE on {s:?}");
        assert!(ids.len() < s.len(), "merges must compress {s:?}");
    }
    // The Llama-3 pattern splits as tiktoken's does.
    let mut pts = PreTokenizedString::from("Hello world's 12345  x\n\n");
    pre.pre_tokenize(&mut pts).unwrap();
    let s = "Hello world's 12345  x\n\n";
    let pieces: Vec<&str> = pts
        .get_splits(OffsetReferential::Original, OffsetType::Byte)
        .iter()
        .map(|(_, (a, b), _)| &s[*a..*b])
        .collect();
    assert_eq!(
        pieces,
        ["Hello", " world", "'s", " ", "123", "45", " ", " x", "\n\n"]
    );
    assert!(LLAMA3_PATTERN.contains("\\p{N}{1,3}"));
}

#[test]
fn bad_rank_files_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("bad.tiktoken");
    std::fs::write(&p, "IQ== 0\nnot-base64! 1\n").unwrap();
    let e = convert(&p, "llama3", &dir.path().join("o.json"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("bad.tiktoken") && e.contains("line 2"), "{e}");
    std::fs::write(&p, "IQ== 0\n").unwrap();
    let e = convert(&p, "llama3", &dir.path().join("o.json"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("256"), "{e}");
    let e = convert(&p, "gpt9", &dir.path().join("o.json"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("256") || e.contains("pattern"), "{e}");
}
