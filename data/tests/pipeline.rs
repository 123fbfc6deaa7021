//! Packing, filters, rank sharding, shuffling determinism and the embedded default data.

mod common;

use common::{doc_text, docs_of, write_shard};
use flamia_data::{Config, Loader, IGNORE_INDEX};

fn cfg(train: Vec<String>) -> Config {
    Config {
        train: train.clone(),
        val: train,
        seq_len: 64,
        batch_rows: 3,
        shuffle_buffer: 16,
        num_threads: 2,
        prefetch: 2,
        ..Config::default()
    }
}

/// All batches of a one-pass (validation) loader.
fn one_pass(c: &Config, rank: usize, world: usize) -> Vec<flamia_data::Batch> {
    Loader::validation(c, rank, world)
        .unwrap()
        .map(|b| b.unwrap())
        .collect()
}

/// The input stream of a one-pass loader with the padding of its last row removed.
fn stream_ids(batches: &[flamia_data::Batch]) -> Vec<u32> {
    let mut ids: Vec<u32> = batches.iter().flat_map(|b| b.tokens.iter().copied()).collect();
    while ids.len() >= 2 && ids[ids.len() - 1] == 256 && ids[ids.len() - 2] == 256 {
        ids.pop();
    }
    ids
}

#[test]
fn rows_pack_documents_with_eos_boundaries_and_shifted_targets() {
    let dir = tempfile::tempdir().unwrap();
    let p = write_shard(dir.path(), "a.parquet", 0, 50, 7);
    let c = cfg(vec![p.display().to_string()]);
    let batches = one_pass(&c, 0, 1);
    let ids = stream_ids(&batches);
    let want: Vec<String> = (0..50).map(doc_text).collect();
    assert_eq!(docs_of(&ids), want, "validation keeps file order and every token");
    let n = c.seq_len;
    let mut row_no = 0;
    for b in &batches {
        assert_eq!(b.tokens.len(), b.rows * n);
        assert_eq!(b.targets.len(), b.rows * n);
        for r in 0..b.rows {
            let row = &b.tokens[r * n..(r + 1) * n];
            let tg = &b.targets[r * n..(r + 1) * n];
            let cu = &b.cu_seqlens[r];
            assert_eq!((cu[0], *cu.last().unwrap()), (0, n as u32));
            assert!(cu.windows(2).all(|w| w[0] < w[1]));
            // The last row is padded with end-of-text inputs past the real stream.
            let real = ids.len().saturating_sub(row_no * n).min(n);
            row_no += 1;
            assert!(tg[real..].iter().all(|&t| t == IGNORE_INDEX));
            for i in 0..real {
                // A document starts with BOS, which predicts the document's first byte.
                if row[i] == 257 {
                    assert!(i == 0 || row[i - 1] == 256, "BOS only after an end-of-text");
                    assert!(i + 1 >= n || (row[i + 1] < 256 && tg[i] == i64::from(row[i + 1])));
                }
                // Every end-of-text closes a segment and its target is ignored.
                if row[i] == 256 {
                    assert_eq!(tg[i], IGNORE_INDEX);
                    assert!(cu.contains(&(i as u32 + 1)), "boundary after eos at {i}");
                } else if i + 1 < n {
                    assert_eq!(tg[i], i64::from(row[i + 1]));
                }
            }
            // Inner boundaries sit exactly after end-of-text tokens.
            for &c in cu[1..cu.len() - 1].iter().filter(|&&c| (c as usize) < real) {
                assert_eq!(row[c as usize - 1], 256);
            }
        }
    }
    // A row's last target is the next row's first input (documents cut at the edge continue).
    let flat_t: Vec<i64> = batches.iter().flat_map(|b| b.targets.iter().copied()).collect();
    for k in 1..ids.len() / n {
        let t = flat_t[k * n - 1];
        assert!(t == IGNORE_INDEX || t == i64::from(ids[k * n]));
    }
    let packed = batches[0].packed_cu_seqlens();
    assert_eq!(*packed.last().unwrap(), batches[0].rows * n);
    assert!(packed.contains(&n) && packed.windows(2).all(|w| w[0] < w[1]));
}

#[test]
fn documents_are_bos_text_eos() {
    let dir = tempfile::tempdir().unwrap();
    let p = write_shard(dir.path(), "a.parquet", 0, 3, 8);
    let c = cfg(vec![p.display().to_string()]);
    let ids = stream_ids(&one_pass(&c, 0, 1));
    let mut want = Vec::new();
    for i in 0..3 {
        want.push(257);
        want.extend(doc_text(i).bytes().map(u32::from));
        want.push(256);
    }
    assert_eq!(ids, want);
}

#[test]
fn doc_cap_splits_documents_into_pieces_without_dropping() {
    let dir = tempfile::tempdir().unwrap();
    let p = write_shard(dir.path(), "a.parquet", 0, 60, 8);
    let mut c = cfg(vec![p.display().to_string()]);
    c.max_doc_tokens = Some(5);
    let batches = one_pass(&c, 0, 1);
    let docs = docs_of(&stream_ids(&batches));
    let want: Vec<String> = (0..60).map(doc_text).collect();
    assert_eq!(docs, want, "every byte of every document is kept");
    let n = c.seq_len;
    for b in &batches {
        for r in 0..b.rows {
            let row = &b.tokens[r * n..(r + 1) * n];
            let tg = &b.targets[r * n..(r + 1) * n];
            let cu = &b.cu_seqlens[r];
            // No attention segment is longer than the cap (row edges cut too).
            assert!(cu.windows(2).all(|w| w[1] - w[0] <= 5), "{cu:?}");
            for &e in &cu[1..cu.len() - 1] {
                let i = e as usize - 1;
                // A segment ends at an end-of-text (target ignored) or at a piece edge inside a
                // document, whose last token still predicts the next piece's first token.
                if row[i] != 256 {
                    assert_eq!(tg[i], i64::from(row[i + 1]), "piece edge at {i}");
                } else {
                    assert_eq!(tg[i], IGNORE_INDEX);
                }
            }
        }
    }

    c.max_doc_tokens = None;
    c.min_int_score = Some(4);
    c.language = Some("en".into());
    let docs = docs_of(&stream_ids(&one_pass(&c, 0, 1)));
    let want: Vec<String> = (0..60)
        .filter(|i| i % 6 >= 4 && i % 3 != 0)
        .map(doc_text)
        .collect();
    assert_eq!(docs, want);
}

#[test]
fn ranks_get_disjoint_shares_covering_everything() {
    let dir = tempfile::tempdir().unwrap();
    write_shard(dir.path(), "a.parquet", 0, 40, 5);
    write_shard(dir.path(), "b.parquet", 40, 35, 5);
    // Directory spec (sorted files) and, below, the same shards through a glob.
    for spec in [
        dir.path().display().to_string(),
        format!("{}/*.parquet", dir.path().display()),
    ] {
        for world in [1, 3, 20] {
            // world 20 > 15 row groups: every rank reads all groups and keeps every 20th document.
            let c = cfg(vec![spec.clone()]);
            let mut all: Vec<String> = Vec::new();
            for rank in 0..world {
                all.extend(docs_of(&stream_ids(&one_pass(&c, rank, world))));
            }
            all.sort();
            let mut want: Vec<String> = (0..75).map(doc_text).collect();
            want.sort();
            assert_eq!(all, want, "world {world}");
        }
    }
}

#[test]
fn shuffling_is_seeded_and_deterministic() {
    let dir = tempfile::tempdir().unwrap();
    let p = write_shard(dir.path(), "a.parquet", 0, 200, 10);
    let c = cfg(vec![p.display().to_string()]);
    let take = |c: &Config| -> Vec<flamia_data::Batch> {
        Loader::new(c, 1, 2, None)
            .unwrap()
            .take(12)
            .map(|b| b.unwrap())
            .collect()
    };
    let a = take(&c);
    assert_eq!(a, take(&c));
    let other = Config { seed: 7, ..c.clone() };
    assert_ne!(a, take(&other));
    let unshuffled = Config {
        shuffle: false,
        ..c.clone()
    };
    let u = take(&unshuffled);
    assert_ne!(a, u);
    // Unshuffled rank 1 of 2 reads row groups 1, 3, 5, ... in order.
    let docs = docs_of(&u[0].tokens);
    assert_eq!(docs[0], doc_text(10));
}

/// Row group of a test document: shards of 30-row groups, document `i` in group `i / 30`.
fn groups_of_first_block(k: usize) -> usize {
    let dir = tempfile::tempdir().unwrap();
    let p = write_shard(dir.path(), "a.parquet", 0, 240, 30);
    let c = Config {
        shuffle_row_groups: k,
        seq_len: 512,
        batch_rows: 1,
        ..cfg(vec![p.display().to_string()])
    };
    let b = Loader::new(&c, 0, 1, None)
        .unwrap()
        .next_batch()
        .unwrap()
        .unwrap();
    let docs = docs_of(&b.tokens);
    let index = |d: &String| -> usize { d[1..d.find('>').unwrap()].parse().unwrap() };
    let mut groups: Vec<usize> = docs.iter().map(|d| index(d) / 30).collect();
    assert!(docs.len() >= 10, "{} documents in the first row", docs.len());
    groups.sort();
    groups.dedup();
    groups.len()
}

#[test]
fn shuffling_mixes_documents_across_row_groups() {
    // One row group at a time: the first row's documents all come from one row group.
    assert_eq!(groups_of_first_block(1), 1);
    // Four row groups permuted together: the first row mixes several of them.
    assert!(groups_of_first_block(4) >= 3);
}

#[test]
fn drops_are_counted() {
    let dir = tempfile::tempdir().unwrap();
    let p = write_shard(dir.path(), "a.parquet", 0, 60, 8);
    let c = Config {
        min_int_score: Some(4),
        language: Some("en".into()),
        ..cfg(vec![p.display().to_string()])
    };
    let mut l = Loader::validation(&c, 0, 1).unwrap();
    while l.next_batch().unwrap().is_some() {}
    let d = l.drops();
    // int_score = i % 6: 40 of 60 below 4; of the rest, language "fr" when i % 3 == 0.
    let score = (0..60).filter(|i| i % 6 < 4).count() as u64;
    let lang = (0..60).filter(|i| i % 6 >= 4 && i % 3 == 0).count() as u64;
    assert_eq!(
        (d.score, d.language, d.empty, d.rows()),
        (score, lang, 0, score + lang)
    );
}

#[test]
fn embedded_default_data_trains_and_validates() {
    let c = Config {
        seq_len: 256,
        batch_rows: 4,
        ..Config::default()
    };
    let mut l = Loader::new(&c, 0, 1, None).unwrap();
    assert_eq!((l.vocab_size(), l.eos_id()), (258, 256));
    let b = l.next_batch().unwrap().unwrap();
    assert_eq!((b.rows, b.seq_len, b.tokens.len()), (4, 256, 1024));
    let text: String = b
        .tokens
        .iter()
        .filter(|&&t| t < 256)
        .map(|&t| t as u8 as char)
        .collect();
    assert!(
        text.chars().filter(|c| c.is_ascii_alphabetic()).count() > 500,
        "{text}"
    );
    let val = Loader::validation(&c, 0, 1).unwrap();
    let tokens: usize = val.map(|b| b.unwrap().target_tokens()).sum();
    assert!(tokens > 100_000, "validation shard holds {tokens} target tokens");
}
