//! `flamia train` through the data-parallel path on CPU (rank-0 TCP store instead of NCCL):
//! (a) a plain run and (b) the same config started as rank 0 of a world of 1 (torchrun-style
//! variables, loopback rendezvous, gradient all-reduce and loss mean through the store) log
//! bitwise the same losses; (c) two ranks with half the rows each (same global batch) train in
//! lock step: rank 0 alone writes the metrics, the checkpoint holds both ranks' data states, and
//! the losses stay close to the plain run's (not equal: each rank reads its own share of the
//! documents, so the batches differ from the plain run's). Validation during training runs in
//! every case (collective across ranks).

use std::path::Path;
use std::process::{Command, Output};

mod support;
use support::{flamia, free_port, losses, repo, val_losses};

const STEPS: usize = 6;
const LAUNCH_VARS: [&str; 8] = [
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "SLURM_PROCID",
    "SLURM_NTASKS",
];

/// `flamia train` on the tiny config, `rows` rows of 64 tokens per rank, no launcher variables.
fn command(dir: &Path, rows: usize) -> Command {
    let mut c = flamia();
    c.current_dir(repo()).args([
        "train",
        "--config",
        "configs/tiny-cpu.toml",
        "--set",
        &format!("training.steps={STEPS}"),
        "--set",
        &format!("run.dir={}", dir.display()),
        "--set",
        "run.log_every=1",
        "--set",
        "run.device=cpu",
        "--set",
        "run.progress=false",
        "--set",
        "data.seq_len=64",
        "--set",
        &format!("data.batch_rows={rows}"),
        "--set",
        "data.max_doc_tokens=64",
        "--set",
        "training.val_every=3",
        "--set",
        "training.val_tokens=256",
    ]);
    for v in LAUNCH_VARS {
        c.env_remove(v);
    }
    c
}

fn check(out: &Output, what: &str) {
    assert!(
        out.status.success(),
        "{what} failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Starts `world` ranks (torchrun variables, loopback rendezvous) and waits for all of them.
fn launch(dir: &Path, world: usize, rows: usize) {
    let port = free_port().to_string();
    let children: Vec<_> = (0..world)
        .map(|r| {
            command(dir, rows)
                .env("RANK", r.to_string())
                .env("LOCAL_RANK", r.to_string())
                .env("WORLD_SIZE", world.to_string())
                .env("LOCAL_WORLD_SIZE", world.to_string())
                .env("MASTER_ADDR", "127.0.0.1")
                .env("MASTER_PORT", &port)
                .env("FLAMIA_DIST_JOIN_TIMEOUT_S", "60")
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .expect("spawn a rank")
        })
        .collect();
    for (r, c) in children.into_iter().enumerate() {
        check(&c.wait_with_output().unwrap(), &format!("rank {r} of {world}"));
    }
}

#[test]
fn world_size_one_through_the_store_equals_the_plain_run_bitwise() {
    let tmp = tempfile::tempdir().unwrap();
    let (plain, dist) = (tmp.path().join("plain"), tmp.path().join("dist1"));
    check(&command(&plain, 2).output().unwrap(), "plain run");
    launch(&dist, 1, 2);
    let (lp, ld) = (losses(&plain), losses(&dist));
    assert_eq!(lp.len(), STEPS, "plain run logs every step");
    // Bitwise: the average of one rank is the value itself, and the store path round-trips f32
    // gradients and f64 losses exactly; any change to the update would change a loss bit.
    assert_eq!(
        lp, ld,
        "world size 1 through the distributed path must equal the plain run"
    );
    // Validation after steps 3 and 6, its loss combined through the store: the same bits.
    let (vp, vd) = (val_losses(&plain), val_losses(&dist));
    assert_eq!(vp.iter().map(|v| v.0).collect::<Vec<_>>(), vec![3, 6]);
    assert_eq!(vp, vd);
    assert!(
        !dist
            .join("checkpoints")
            .read_dir()
            .unwrap()
            .any(|e| { e.unwrap().path().join("data_states.json").exists() }),
        "world size 1 keeps the plain checkpoint layout"
    );
}

#[test]
fn two_ranks_share_the_global_batch_and_stay_in_lock_step() {
    let tmp = tempfile::tempdir().unwrap();
    let (plain, dist) = (tmp.path().join("plain"), tmp.path().join("dist2"));
    check(&command(&plain, 2).output().unwrap(), "plain run");
    launch(&dist, 2, 1);
    let (lp, ld) = (losses(&plain), losses(&dist));
    assert_eq!(
        ld.iter().map(|x| x.0).collect::<Vec<_>>(),
        (1..=STEPS as u64).collect::<Vec<_>>(),
        "rank 0 alone logs each step once"
    );
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dist.join("summary.json")).unwrap()).unwrap();
    assert_eq!(
        summary["tokens"].as_u64(),
        Some((STEPS * 2 * 64) as u64),
        "global tokens"
    );
    // Same initial weights (rank 0's, broadcast to rank 1) and the same global batch size, but
    // other batches (per-rank document shares), so only closeness is asserted: step 1 (the
    // untrained model, loss about ln(vocab)) within 2%, every step within 10% (measured: 5.7% at
    // step 6 from batch-to-batch noise), and both runs learn (last loss below the first).
    for ((s, a), (_, b)) in lp.iter().zip(&ld) {
        assert!(b.is_finite(), "step {s}: loss {b}");
        let tol = if *s == 1 { 0.02 } else { 0.10 };
        assert!((a - b).abs() / a < tol, "step {s}: plain {a} vs 2 ranks {b}");
    }
    assert!(
        ld[STEPS - 1].1 < ld[0].1 && lp[STEPS - 1].1 < lp[0].1,
        "both runs learn"
    );
    // Validation is collective: both ranks score their share (128 tokens each) of the same
    // 256-token budget, rank 0 logs the combined loss, close to the plain run's.
    let (vp, vd) = (val_losses(&plain), val_losses(&dist));
    assert_eq!(vd.iter().map(|v| v.0).collect::<Vec<_>>(), vec![3, 6]);
    for ((s, a), (_, b)) in vp.iter().zip(&vd) {
        assert!(
            (a - b).abs() / a < 0.10,
            "step {s}: validation plain {a} vs 2 ranks {b}"
        );
    }
    let ckpt = std::fs::read_dir(dist.join("checkpoints"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .max()
        .expect("a checkpoint");
    let states: Vec<serde_json::Value> =
        serde_json::from_str(&std::fs::read_to_string(ckpt.join("data_states.json")).unwrap()).unwrap();
    assert_eq!(states.len(), 2, "one data state per rank");
    assert_ne!(states[0], states[1], "the ranks read different shares");
}
