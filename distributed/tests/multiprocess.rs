//! Rendezvous and failure detection among real processes on loopback: each test spawns
//! `flamia-dist rendezvous` children with torchrun-style variables on a fresh port.

use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

#[path = "../../tests/support/mod.rs"]
mod support;
use support::{dist_bin, free_port};

fn spawn(rank: usize, world: usize, port: u16, extra: &[&str]) -> Child {
    spawn_in_job(rank, world, port, extra, None)
}

/// As [`spawn`], with `FLAMIA_RUN_ID=job` when given.
fn spawn_in_job(rank: usize, world: usize, port: u16, extra: &[&str], job: Option<&str>) -> Child {
    let mut c = Command::new(dist_bin());
    c.args(["--join-timeout", "20", "--heartbeat-timeout", "2"])
        .arg("rendezvous")
        .args(extra)
        .env_clear()
        .env("RANK", rank.to_string())
        .env("WORLD_SIZE", world.to_string())
        .env("LOCAL_RANK", rank.to_string())
        .env("MASTER_ADDR", "127.0.0.1")
        .env("MASTER_PORT", port.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(job) = job {
        c.env("FLAMIA_RUN_ID", job);
    }
    c.spawn().expect("spawn flamia-dist")
}

/// Wait for a child with a deadline (kill it and fail past it); returns output and elapsed time.
fn finish(mut child: Child, limit: Duration) -> (Output, Duration) {
    let start = Instant::now();
    loop {
        if child.try_wait().unwrap().is_some() {
            return (child.wait_with_output().unwrap(), start.elapsed());
        }
        if start.elapsed() > limit {
            child.kill().ok();
            let out = child.wait_with_output().unwrap();
            panic!(
                "child still running after {limit:?}: stderr {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Arguments of a run that goes on until something stops it: many barrier steps of 20 ms.
const ENDLESS: [&str; 4] = ["--steps", "100000", "--step-ms", "20"];

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn four_ranks_exchange_the_same_id() {
    let port = free_port();
    // Non-zero ranks start first: they must retry until rank 0 listens.
    let mut kids: Vec<(usize, Child)> = (1..4)
        .rev()
        .map(|r| (r, spawn(r, 4, port, &["--steps", "3"])))
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    kids.push((0, spawn(0, 4, port, &["--steps", "3"])));
    let mut digests = Vec::new();
    for (rank, kid) in kids {
        let (out, _) = finish(kid, Duration::from_secs(30));
        assert!(out.status.success(), "rank {rank} failed: {}", stderr(&out));
        let stdout = String::from_utf8_lossy(&out.stdout);
        let joined: serde_json::Value = serde_json::from_str(stdout.lines().next().unwrap()).unwrap();
        assert_eq!(joined["rank"], rank);
        assert_eq!(joined["world_size"], 4);
        assert_eq!(joined["payload_len"], 128);
        assert_eq!(joined["hosts"].as_array().unwrap().len(), 4);
        assert!(stdout.contains("\"event\":\"done\""), "rank {rank}: {stdout}");
        digests.push(joined["payload_digest"].as_str().unwrap().to_string());
    }
    assert!(
        digests.windows(2).all(|w| w[0] == w[1]),
        "ranks received different ids: {digests:?}"
    );
}

#[test]
fn unreachable_master_times_out_with_a_clear_error() {
    let port = free_port(); // nothing listens here
    let kid = Command::new(dist_bin())
        .args(["--join-timeout", "1.5", "rendezvous"])
        .env_clear()
        .env("RANK", "1")
        .env("WORLD_SIZE", "2")
        .env("MASTER_ADDR", "127.0.0.1")
        .env("MASTER_PORT", port.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (out, took) = finish(kid, Duration::from_secs(15));
    assert_eq!(
        out.status.code(),
        Some(flamia_dist::PEER_FAILURE_EXIT_CODE),
        "{}",
        stderr(&out)
    );
    assert!(stderr(&out).contains("unreachable"), "{}", stderr(&out));
    assert!(
        took >= Duration::from_millis(1400) && took < Duration::from_secs(8),
        "took {took:?}"
    );
}

#[test]
fn wrong_world_size_fails_every_rank() {
    let port = free_port();
    let r0 = spawn(0, 2, port, &[]);
    let r1 = spawn(1, 3, port, &[]);
    for (rank, kid) in [(0, r0), (1, r1)] {
        let (out, took) = finish(kid, Duration::from_secs(15));
        assert!(!out.status.success(), "rank {rank} should fail");
        let err = stderr(&out);
        assert!(
            err.contains("world size mismatch") && err.contains("WORLD_SIZE=3"),
            "rank {rank}: {err}"
        );
        assert!(took < Duration::from_secs(10), "rank {rank} took {took:?}");
    }
}

#[test]
fn duplicate_rank_fails_every_rank() {
    let port = free_port();
    let r0 = spawn(0, 3, port, &[]);
    let a = spawn(1, 3, port, &[]);
    std::thread::sleep(Duration::from_millis(200));
    let b = spawn(1, 3, port, &[]);
    for (name, kid) in [("rank 0", r0), ("first rank 1", a), ("second rank 1", b)] {
        let (out, took) = finish(kid, Duration::from_secs(15));
        assert!(!out.status.success(), "{name} should fail");
        assert!(
            stderr(&out).contains("duplicate rank 1"),
            "{name}: {}",
            stderr(&out)
        );
        assert!(took < Duration::from_secs(10), "{name} took {took:?}");
    }
}

/// A second job started on the port of a running one (same default MASTER_PORT): its rank 0
/// cannot listen, its other ranks are refused with the reason, and the running job finishes.
#[test]
fn a_second_job_on_the_same_port_leaves_the_running_job_alone() {
    let port = free_port();
    let steps = ["--steps", "60", "--step-ms", "20"];
    let first: Vec<Child> = (0..2)
        .map(|r| spawn_in_job(r, 2, port, &steps, Some("first")))
        .collect();
    // The first job's rank 0 listens before the second job starts (a bare connection that says
    // nothing is dropped by the server without touching the group), and has had time to form.
    let listening = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            listening.elapsed() < Duration::from_secs(10),
            "the first job's rank 0 never listened"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(300));
    // The second job: a world size of 3, which would fail the first job's group if admitted.
    let second: Vec<Child> = (0..3)
        .map(|r| spawn_in_job(r, 3, port, &[], Some("second")))
        .collect();
    for (rank, kid) in second.into_iter().enumerate() {
        let (out, took) = finish(kid, Duration::from_secs(15));
        let err = stderr(&out);
        assert!(
            !out.status.success(),
            "second job's rank {rank} should fail: {err}"
        );
        let why = if rank == 0 {
            "cannot listen"
        } else {
            "belongs to job \"first\", this process is job \"second\""
        };
        assert!(
            err.contains(why) && (rank == 0 || err.contains("MASTER_PORT")),
            "second job's rank {rank}: {err}"
        );
        assert!(
            took < Duration::from_secs(10),
            "second job's rank {rank} took {took:?}"
        );
    }
    for (rank, kid) in first.into_iter().enumerate() {
        let (out, _) = finish(kid, Duration::from_secs(30));
        assert!(
            out.status.success(),
            "first job's rank {rank} failed: {}",
            stderr(&out)
        );
        assert!(String::from_utf8_lossy(&out.stdout).contains("\"event\":\"done\""));
    }
}

#[test]
fn killed_rank_is_detected_by_the_others_within_the_timeout() {
    let port = free_port();
    // Rank 2 aborts at step 10 (about 0.2 s in); heartbeat timeout 2 s.
    let args = [&ENDLESS[..], &["--die-rank", "2", "--die-at-step", "10"]].concat();
    let kids: Vec<Child> = (0..3).map(|r| spawn(r, 3, port, &args)).collect();
    let mut outs = Vec::new();
    for kid in kids {
        outs.push(finish(kid, Duration::from_secs(20)));
    }
    let (dead, _) = &outs[2];
    assert!(!dead.status.success());
    for (rank, (out, took)) in outs.iter().enumerate().take(2) {
        let err = stderr(out);
        assert_eq!(
            out.status.code(),
            Some(flamia_dist::PEER_FAILURE_EXIT_CODE),
            "rank {rank}: {err}"
        );
        assert!(
            err.contains("rank 2"),
            "rank {rank} should name the dead rank: {err}"
        );
        // Join + 10 steps + detection (connection loss is immediate; heartbeat timeout 2 s).
        assert!(
            *took < Duration::from_secs(8),
            "rank {rank} took {took:?} to notice"
        );
    }
}

#[test]
fn frozen_rank_is_detected_by_missing_heartbeats() {
    let port = free_port();
    let args = ENDLESS;
    let mut kids: Vec<Child> = (0..3).map(|r| spawn(r, 3, port, &args)).collect();
    std::thread::sleep(Duration::from_millis(800));
    // Freeze rank 1 (alive, connections open, but silent): only the heartbeat timeout can tell.
    let mut frozen = kids.remove(1);
    let stopped = Command::new("kill")
        .args(["-STOP", &frozen.id().to_string()])
        .status()
        .unwrap();
    assert!(stopped.success());
    let stop_time = Instant::now();
    let mut exited_after = [None, None];
    while exited_after.iter().any(|t| t.is_none()) && stop_time.elapsed() < Duration::from_secs(20) {
        for (i, kid) in kids.iter_mut().enumerate() {
            if exited_after[i].is_none() && kid.try_wait().unwrap().is_some() {
                exited_after[i] = Some(stop_time.elapsed());
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    frozen.kill().ok();
    frozen.wait().ok();
    for ((rank, kid), took) in [0, 2].into_iter().zip(kids).zip(exited_after) {
        let (out, _) = finish(kid, Duration::from_secs(1));
        let err = stderr(&out);
        let took = took.unwrap_or_else(|| panic!("rank {rank} did not stop: {err}"));
        eprintln!("rank {rank} stopped {took:?} after rank 1 froze");
        assert_eq!(
            out.status.code(),
            Some(flamia_dist::PEER_FAILURE_EXIT_CODE),
            "rank {rank}: {err}"
        );
        assert!(
            err.contains("rank 1") && err.contains("no heartbeat"),
            "rank {rank}: {err}"
        );
        // Heartbeat timeout 2 s: detected after at least the timeout, and not much later.
        assert!(
            took >= Duration::from_millis(1500) && took < Duration::from_secs(8),
            "rank {rank}: {took:?}"
        );
    }
}

#[test]
fn panicking_rank_reports_failure_and_the_others_stop_within_the_heartbeat_timeout() {
    let port = free_port();
    // Rank 1 panics (unwinds, as a failed tch call does) at step 10; heartbeat timeout 2 s.
    let args = [&ENDLESS[..], &["--panic-rank", "1", "--die-at-step", "10"]].concat();
    let mut kids: Vec<Option<Child>> = (0..3).map(|r| Some(spawn(r, 3, port, &args))).collect();
    let start = Instant::now();
    let mut exited: [Option<Duration>; 3] = [None; 3];
    let mut outs: Vec<Option<Output>> = vec![None, None, None];
    while exited.iter().any(|t| t.is_none()) && start.elapsed() < Duration::from_secs(30) {
        for r in 0..3 {
            if exited[r].is_none() && kids[r].as_mut().unwrap().try_wait().unwrap().is_some() {
                exited[r] = Some(start.elapsed());
                outs[r] = Some(kids[r].take().unwrap().wait_with_output().unwrap());
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    for k in kids.iter_mut().flatten() {
        k.kill().ok();
    }
    let panicked_at = exited[1].expect("rank 1 exits after its panic");
    let out1 = outs[1].as_ref().unwrap();
    assert!(!out1.status.success(), "{}", stderr(out1));
    assert!(stderr(out1).contains("panicking at step 10 on purpose"));
    for r in [0, 2] {
        let took = exited[r].unwrap_or_else(|| panic!("rank {r} did not stop"));
        let out = outs[r].as_ref().unwrap();
        let err = stderr(out);
        let after = took.saturating_sub(panicked_at);
        eprintln!("rank {r} stopped {after:?} after rank 1 exited");
        assert_eq!(
            out.status.code(),
            Some(flamia_dist::PEER_FAILURE_EXIT_CODE),
            "rank {r}: {err}"
        );
        assert!(
            err.contains("rank 1") && err.contains("panicked") && err.contains("on purpose"),
            "rank {r} should name the panicking rank and its message: {err}"
        );
        // The report is sent before the panicking process exits: the others stop well within
        // the heartbeat timeout (2 s) instead of waiting for a store timeout.
        assert!(after < Duration::from_secs(2), "rank {r}: {after:?}");
    }
}

#[test]
fn a_signal_to_one_rank_stops_every_rank_at_the_same_step_with_status_75() {
    let port = free_port();
    let args = [&ENDLESS[..], &["--stop-on-signal"]].concat();
    let kids: Vec<Child> = (0..3).map(|r| spawn(r, 3, port, &args)).collect();
    std::thread::sleep(Duration::from_millis(1000));
    // Only rank 2 hears from the scheduler; the vote carries it to the others.
    let sent = Command::new("kill")
        .args(["-USR1", &kids[2].id().to_string()])
        .status()
        .unwrap();
    assert!(sent.success());
    let mut steps = Vec::new();
    for (rank, kid) in kids.into_iter().enumerate() {
        let (out, _) = finish(kid, Duration::from_secs(20));
        assert_eq!(
            out.status.code(),
            Some(flamia_dist::PREEMPTED_EXIT_CODE),
            "rank {rank}: {}",
            stderr(&out)
        );
        let stdout = String::from_utf8_lossy(&out.stdout);
        let line = stdout
            .lines()
            .find(|l| l.contains("\"stopped\""))
            .unwrap_or_else(|| panic!("rank {rank}: {stdout}"));
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        let expect_signal = if rank == 2 {
            "SIGUSR1".into()
        } else {
            serde_json::Value::Null
        };
        assert_eq!(v["signal"], expect_signal, "rank {rank}: {line}");
        steps.push(v["step"].as_u64().unwrap());
    }
    assert!(
        steps.windows(2).all(|w| w[0] == w[1]) && steps[0] > 0,
        "every rank stops at the same step: {steps:?}"
    );
}
