//! `launch/local.sh` end to end on the CPU: it starts N ranks of `flamia-dist rendezvous`
//! (torchrun-style variables, loopback rendezvous), and when one rank dies it exits with that
//! rank's status after the survivors have stopped with a clear error; a SIGTERM to the script
//! reaches every rank, which stop together, and the script exits with their status 75.

use std::process::Command;
use std::time::{Duration, Instant};

mod support;
use support::{dist_bin, free_port, repo};

fn local_sh(n: usize, args: &[&str]) -> (std::process::Output, Duration) {
    let bin = dist_bin(); // may build it: not part of the launch's time
    let start = Instant::now();
    let out = Command::new("bash")
        .arg(repo().join("launch/local.sh"))
        .arg(n.to_string())
        .arg(bin)
        .args(["--join-timeout", "20", "--heartbeat-timeout", "2", "rendezvous"])
        .args(args)
        .env("MASTER_PORT", free_port().to_string())
        .env("FLAMIA_LAUNCH_GRACE_S", "10")
        .output()
        .expect("run launch/local.sh");
    (out, start.elapsed())
}

#[test]
fn local_sh_runs_every_rank_with_one_id() {
    let (out, _) = local_sh(3, &["--steps", "3"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "stdout {stdout}\nstderr {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut digests = Vec::new();
    for r in 0..3 {
        let line = stdout
            .lines()
            .find(|l| l.starts_with(&format!("[{r}] {{\"event\":\"joined\"")))
            .unwrap();
        let v: serde_json::Value = serde_json::from_str(line.split_once(' ').unwrap().1).unwrap();
        assert_eq!(v["world_size"], 3);
        digests.push(v["payload_digest"].as_str().unwrap().to_string());
        assert!(
            stdout.contains(&format!("[{r}] {{\"event\":\"done\"")),
            "{stdout}"
        );
    }
    assert!(digests.windows(2).all(|w| w[0] == w[1]));
}

#[test]
fn local_sh_reports_the_dead_rank_and_fails() {
    let args = [
        "--steps",
        "100000",
        "--step-ms",
        "20",
        "--die-rank",
        "1",
        "--die-at-step",
        "5",
    ];
    let (out, took) = local_sh(3, &args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("local.sh: rank 1 exited with status"), "{stderr}");
    for survivor in [0, 2] {
        assert!(
            stderr.contains(&format!("[{survivor}] error:")) && stderr.contains("rank 1 ("),
            "{stderr}"
        );
    }
    assert!(
        took < Duration::from_secs(9),
        "survivors should stop on their own, took {took:?}"
    );
}

#[test]
fn local_sh_passes_sigterm_to_every_rank_and_exits_75_after_they_stop() {
    let bin = dist_bin();
    let child = Command::new("bash")
        .arg(repo().join("launch/local.sh"))
        .arg("3")
        .arg(bin)
        .args(["--join-timeout", "20", "--heartbeat-timeout", "2", "rendezvous"])
        .args(["--steps", "100000", "--step-ms", "20", "--stop-on-signal"])
        .env("MASTER_PORT", free_port().to_string())
        .env("FLAMIA_LAUNCH_GRACE_S", "10")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    let sent = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(sent.success());
    let start = Instant::now();
    let out = child.wait_with_output().unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert_eq!(out.status.code(), Some(75), "stdout {stdout}\nstderr {stderr}");
    assert!(start.elapsed() < Duration::from_secs(9), "{stderr}");
    for r in 0..3 {
        assert!(
            stdout.contains(&format!("[{r}] {{\"event\":\"stopped\"")),
            "rank {r} did not stop through the vote: {stdout}\n{stderr}"
        );
    }
    assert!(!stderr.contains("FAILED"), "{stderr}");
}
