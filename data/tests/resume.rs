//! Exact resume: a loader rebuilt from a saved state yields exactly the batches the uninterrupted
//! loader yields next, across shuffle blocks, row-group groups, document pieces and epochs, on
//! every rank.

mod common;

use common::write_shard;
use flamia_data::{Config, DataState, Loader};

fn cfg(dir: &std::path::Path) -> Config {
    Config {
        train: vec![dir.display().to_string()],
        seq_len: 48,
        batch_rows: 2,
        shuffle_buffer: 7,
        // Documents of 3 row groups permuted together; documents longer than 60 tokens in pieces.
        shuffle_row_groups: 3,
        num_threads: 3,
        prefetch: 3,
        max_doc_tokens: Some(60),
        seed: 11,
        ..Config::default()
    }
}

#[test]
fn resumed_stream_equals_uninterrupted_stream() {
    let dir = tempfile::tempdir().unwrap();
    write_shard(dir.path(), "a.parquet", 0, 90, 9);
    write_shard(dir.path(), "b.parquet", 90, 50, 6);
    let c = cfg(dir.path());
    for (rank, world) in [(0, 1), (1, 2), (2, 3)] {
        let mut l = Loader::new(&c, rank, world, None).unwrap();
        let mut batches = Vec::new();
        let mut states = Vec::new();
        // Enough batches to cross several shuffle blocks and epochs (each epoch here is a few
        // thousand tokens per rank).
        for _ in 0..200 {
            batches.push(l.next_batch().unwrap().unwrap());
            states.push(l.state());
        }
        assert!(
            states.last().unwrap().epoch >= 2,
            "test must cross epochs: {:?}",
            states.last()
        );
        for k in [0usize, 1, 17, 40, 77, 118, 190] {
            // Through JSON, as a checkpoint stores it.
            let json = serde_json::to_string(&states[k]).unwrap();
            let st: DataState = serde_json::from_str(&json).unwrap();
            let mut r = Loader::new(&c, rank, world, Some(st)).unwrap();
            for (j, want) in batches[k + 1..].iter().enumerate() {
                let got = r.next_batch().unwrap().unwrap();
                assert_eq!(
                    &got, want,
                    "rank {rank}/{world}: resumed after batch {k}, batch {j} differs"
                );
            }
        }
        // Restart straight from a fresh state: the same stream from the beginning.
        let first = Loader::new(&c, rank, world, None)
            .unwrap()
            .next_batch()
            .unwrap()
            .unwrap();
        assert_eq!(first, batches[0]);
    }
}

#[test]
fn state_is_small_and_refuses_another_run() {
    let dir = tempfile::tempdir().unwrap();
    write_shard(dir.path(), "a.parquet", 0, 60, 6);
    let c = cfg(dir.path());
    let mut l = Loader::new(&c, 0, 2, None).unwrap();
    for _ in 0..5 {
        l.next_batch().unwrap();
    }
    let st = l.state();
    assert!(serde_json::to_string(&st).unwrap().len() < 300);
    let other_seed = Config {
        seed: 12,
        ..c.clone()
    };
    let e = Loader::new(&other_seed, 0, 2, Some(st.clone()))
        .unwrap_err()
        .to_string();
    assert!(e.contains("fingerprint"), "{e}");
    let e = Loader::new(&c, 1, 2, Some(st.clone())).unwrap_err().to_string();
    assert!(e.contains("rank 0 of 2"), "{e}");
    // Batch size may change on restart: the state is a token position.
    let bigger = Config {
        batch_rows: 4,
        ..c.clone()
    };
    let mut a = Loader::new(&bigger, 0, 2, Some(st.clone())).unwrap();
    let mut b = Loader::new(&c, 0, 2, Some(st)).unwrap();
    let x = a.next_batch().unwrap().unwrap();
    let y1 = b.next_batch().unwrap().unwrap();
    let y2 = b.next_batch().unwrap().unwrap();
    assert_eq!(x.tokens, [y1.tokens, y2.tokens].concat());
}
