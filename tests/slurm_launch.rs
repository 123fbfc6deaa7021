//! `launch/slurm.sbatch` rendered for a simulated two-node job, without Slurm: a fake `srun`
//! starts the step's tasks as Slurm would (two nodes x two tasks, per-task `SLURM_PROCID` /
//! `SLURM_LOCALID` / `SLURM_NODEID`, a node-local `TMPDIR` per node, the batch environment
//! inherited, signals forwarded), a fake `scontrol` answers `show job` (the path the job was
//! submitted with) and records `requeue`. The batch script runs as Slurm runs it: a copy in a
//! spool directory, started from another directory, with stale torchrun variables in the
//! submitting environment. Each task records what it sees (environment, working directory, the
//! libnccl link of its node, and `flamia-dist topology`: the placement flamia takes from it).

use std::collections::HashMap;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod support;
use support::{dist_bin, repo};

const NODES: [&str; 2] = ["node01", "node02"];
const TASKS_PER_NODE: usize = 2;
const JOB_ID: &str = "4242";

const FAKE_SRUN: &str = r#"#!/usr/bin/env bash
# Fake srun: FAKE_NODES x SLURM_NTASKS_PER_NODE tasks, each with its node's TMPDIR.
while [ $# -gt 0 ] && [ "${1#-}" != "$1" ]; do shift; done
read -r -a nodes <<< "$FAKE_NODES"
tpn="${SLURM_NTASKS_PER_NODE%%(*}"
pids=()
for n in "${!nodes[@]}"; do
    for ((l = 0; l < tpn; l++)); do
        (
            export SLURM_PROCID=$((n * tpn + l)) SLURM_LOCALID=$l SLURM_NODEID=$n \
                SLURMD_NODENAME="${nodes[$n]}" SLURM_STEP_ID=0 TMPDIR="$FAKE_ROOT/${nodes[$n]}/tmp"
            exec "$@"
        ) &
        pids+=("$!")
    done
done
trap 'kill -s USR1 "${pids[@]}" 2>/dev/null' USR1
trap 'kill -s TERM "${pids[@]}" 2>/dev/null' TERM
rc=0
for p in "${pids[@]}"; do
    while :; do wait "$p"; s=$?; kill -0 "$p" 2>/dev/null || break; done
    [ "$s" -gt 128 ] && { wait "$p" 2>/dev/null; t=$?; [ "$t" = 127 ] || s=$t; }
    [ "$s" -gt "$rc" ] && rc=$s
done
exit "$rc"
"#;

const FAKE_SCONTROL: &str = r#"#!/usr/bin/env bash
case "$1" in
    show) echo "JobId=$3 JobName=flamia"; echo "   Command=$FAKE_SUBMITTED_SCRIPT $FAKE_SUBMITTED_ARGS";;
    requeue) echo "$2" >> "$OUT/requeued";;
esac
"#;

/// What each task runs: record its view, then either exit or wait for a stop signal.
const TASK: &str = r#"#!/usr/bin/env bash
r="$SLURM_PROCID"
env > "$OUT/task$r.env"
pwd > "$OUT/task$r.pwd"
first="${LD_LIBRARY_PATH%%:*}"
readlink -f "$first/libnccl.so" > "$OUT/task$r.nccl" 2>/dev/null
"$DIST_BIN" topology > "$OUT/task$r.json" || exit 1
if [ "${TASK_MODE:-}" = wait-signal ]; then
    trap 'echo "task $r: stopping" >&2; exit 75' USR1 TERM
    touch "$OUT/task$r.ready"
    for _ in $(seq 600); do sleep 0.05; done
    echo "task $r: no signal within 30 s" >&2; exit 1
fi
"#;

struct Job {
    tmp: tempfile::TempDir,
    out: PathBuf,
}

fn write_exec(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap();
    Command::new("chmod").arg("+x").arg(path).status().unwrap();
}

impl Job {
    fn new() -> Job {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        for d in ["bin", "spool", "submit", "out"] {
            std::fs::create_dir_all(root.join(d)).unwrap();
        }
        for n in NODES {
            std::fs::create_dir_all(root.join(n).join("tmp")).unwrap();
        }
        write_exec(&root.join("bin/srun"), FAKE_SRUN);
        write_exec(&root.join("bin/scontrol"), FAKE_SCONTROL);
        write_exec(&root.join("task.sh"), TASK);
        std::fs::write(root.join("libnccl.so.2"), b"not a real library").unwrap();
        // sbatch runs a copy of the script from its spool directory.
        std::fs::copy(
            repo().join("launch/slurm.sbatch"),
            root.join("spool/slurm_script"),
        )
        .unwrap();
        let out = root.join("out");
        Job { tmp, out }
    }

    fn root(&self) -> &Path {
        self.tmp.path()
    }

    /// The batch script as Slurm starts it on the first node (not yet waited for).
    fn start(&self, task_mode: &str) -> std::process::Child {
        let root = self.root();
        let repo = repo().canonicalize().unwrap();
        let path = format!(
            "{}:{}",
            root.join("bin").display(),
            std::env::var("PATH").unwrap_or_default()
        );
        Command::new("bash")
            .arg(root.join("spool/slurm_script"))
            .arg(root.join("task.sh"))
            .current_dir(root.join("submit"))
            .env_clear()
            .env("PATH", path)
            .env("HOME", root)
            // Stale torchrun-style variables from the submitting shell.
            .env("RANK", "0")
            .env("WORLD_SIZE", "1")
            .env("LOCAL_RANK", "0")
            .env("MASTER_ADDR", "127.0.0.1")
            .env("MASTER_PORT", "29500")
            .env("TORCHELASTIC_RUN_ID", "stale")
            // The batch environment Slurm gives the script on the first node.
            .env("SLURM_JOB_ID", JOB_ID)
            .env("SLURM_JOB_NODELIST", "node[01-02]")
            .env("SLURM_NNODES", "2")
            .env("SLURM_NTASKS", (NODES.len() * TASKS_PER_NODE).to_string())
            .env("SLURM_NTASKS_PER_NODE", format!("{TASKS_PER_NODE}(x2)"))
            .env("SLURM_PROCID", "0")
            .env("SLURM_LOCALID", "0")
            .env("SLURM_SUBMIT_DIR", root.join("submit"))
            .env("TMPDIR", root.join("node01/tmp"))
            .env("FLAMIA_NCCL_LIB", root.join("libnccl.so.2"))
            // The fakes' settings.
            .env("FAKE_NODES", NODES.join(" "))
            .env("FAKE_ROOT", root)
            .env(
                "FAKE_SUBMITTED_SCRIPT",
                repo.join("launch/slurm.sbatch").display().to_string(),
            )
            .env("FAKE_SUBMITTED_ARGS", "target/release/flamia train")
            .env("OUT", &self.out)
            .env("DIST_BIN", dist_bin())
            .env("TASK_MODE", task_mode)
            // Its own process group, so the test can end every fake task if it fails.
            .process_group(0)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("bash")
    }

    fn read(&self, name: &str) -> String {
        std::fs::read_to_string(self.out.join(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
    }
}

fn env_of(text: &str) -> HashMap<String, String> {
    text.lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// Ends whatever is left of the job's process group (the fake srun and its tasks).
fn kill_group(child: &std::process::Child) {
    let _ = Command::new("kill")
        .args(["-KILL", "--", &format!("-{}", child.id())])
        .stderr(Stdio::null())
        .status();
}

fn wait_output(child: std::process::Child, limit: Duration) -> std::process::Output {
    let start = Instant::now();
    let mut child = child;
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > limit {
            kill_group(&child);
            panic!("the batch script did not finish within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    kill_group(&child);
    child.wait_with_output().unwrap()
}

#[test]
fn two_node_job_renders_each_task_its_own_rank_node_local_nccl_and_no_stale_variables() {
    let job = Job::new();
    let out = wait_output(job.start(""), Duration::from_secs(60));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "batch script failed: {stderr}");
    let repo = repo().canonicalize().unwrap();
    let uid = String::from_utf8(Command::new("id").arg("-u").output().unwrap().stdout).unwrap();
    let uid = uid.trim();
    let mut seen_ranks = Vec::new();
    for (node_id, node) in NODES.iter().enumerate() {
        for local in 0..TASKS_PER_NODE {
            let rank = node_id * TASKS_PER_NODE + local;
            let env = env_of(&job.read(&format!("task{rank}.env")));
            for stale in [
                "RANK",
                "WORLD_SIZE",
                "LOCAL_RANK",
                "MASTER_ADDR",
                "MASTER_PORT",
                "TORCHELASTIC_RUN_ID",
            ] {
                assert!(
                    !env.contains_key(stale),
                    "task {rank} still sees {stale}={}",
                    env[stale]
                );
            }
            // NCCL: the link lives in this node's TMPDIR, comes first, and points at the library.
            let node_tmp = job.root().join(node).join("tmp");
            let link_dir = node_tmp.join(format!("flamia-nccl-{uid}-job{JOB_ID}"));
            let ldp = &env["LD_LIBRARY_PATH"];
            assert_eq!(
                ldp.split(':').next().unwrap(),
                link_dir.display().to_string(),
                "task {rank} on {node}: LD_LIBRARY_PATH {ldp}"
            );
            for other in NODES.iter().filter(|n| *n != node) {
                assert!(
                    !ldp.contains(&format!("/{other}/tmp")),
                    "task {rank} on {node} has {other}'s node-local directory on LD_LIBRARY_PATH: {ldp}"
                );
            }
            assert_eq!(
                job.read(&format!("task{rank}.nccl")).trim(),
                job.root()
                    .join("libnccl.so.2")
                    .canonicalize()
                    .unwrap()
                    .display()
                    .to_string(),
                "task {rank}: libnccl.so link"
            );
            assert_eq!(env.get("NCCL_NVLS_ENABLE").map(String::as_str), Some("0"));
            assert_eq!(
                env.get("NCCL_SOCKET_IFNAME").map(String::as_str),
                Some("^docker,lo")
            );
            // Runs from the repository root whatever the submit directory.
            assert_eq!(
                job.read(&format!("task{rank}.pwd")).trim(),
                repo.display().to_string()
            );
            // What flamia makes of it.
            let topo: serde_json::Value =
                serde_json::from_str(job.read(&format!("task{rank}.json")).trim()).unwrap();
            assert_eq!(topo["source"], "slurm", "task {rank}: {topo}");
            assert_eq!(topo["rank"], rank, "task {rank}: {topo}");
            assert_eq!(topo["world_size"], NODES.len() * TASKS_PER_NODE);
            assert_eq!(topo["local_rank"], local);
            assert_eq!(topo["local_world_size"], TASKS_PER_NODE);
            assert_eq!(topo["device"], local);
            assert_eq!(
                topo["master"], "node01:24242",
                "first node, 20000 + job id % 10000"
            );
            seen_ranks.push(rank);
        }
    }
    assert_eq!(seen_ranks, vec![0, 1, 2, 3]);
    assert!(
        !job.out.join("requeued").exists(),
        "a finished job is not requeued"
    );
}

#[test]
fn usr1_before_the_time_limit_reaches_every_task_and_status_75_requeues_the_job() {
    let job = Job::new();
    let mut child = job.start("wait-signal");
    let start = Instant::now();
    let n = NODES.len() * TASKS_PER_NODE;
    while (0..n).any(|r| !job.out.join(format!("task{r}.ready")).exists()) {
        if child.try_wait().unwrap().is_some() {
            kill_group(&child);
            let out = child.wait_with_output().unwrap();
            panic!(
                "the batch script ended early: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        assert!(start.elapsed() < Duration::from_secs(60), "tasks did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    // `--signal=B:USR1@300`: Slurm signals the batch shell only.
    let killed = Command::new("kill")
        .args(["-USR1", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let out = wait_output(child, Duration::from_secs(30));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(75), "{stderr}");
    for r in 0..n {
        assert!(
            stderr.contains(&format!("task {r}: stopping")),
            "task {r} did not get the signal: {stderr}"
        );
    }
    assert_eq!(job.read("requeued").trim(), JOB_ID, "{stderr}");
}

/// Every launch command written in the presets, the launch scripts and the docs names a program
/// after the launcher (not a config file) and only files that exist, so it runs as shown from the
/// repository root.
#[test]
fn documented_launch_commands_name_a_program_and_existing_files() {
    let root = repo();
    let mut files: Vec<PathBuf> = ["README.md", "docs/distributed.md", "launch/README.md"]
        .iter()
        .map(|f| root.join(f))
        .collect();
    for dir in ["configs", "launch"] {
        for e in std::fs::read_dir(root.join(dir)).unwrap() {
            files.push(e.unwrap().path());
        }
    }
    let mut checked = 0;
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        for (no, line) in text.lines().enumerate() {
            let at = format!("{}:{}", f.display(), no + 1);
            for launcher in ["launch/local.sh", "launch/slurm.sbatch"] {
                let Some(pos) = line.find(&format!("{launcher} ")) else {
                    continue;
                };
                let rest = &line[pos + launcher.len()..];
                let rest = rest.split('`').next().unwrap();
                let words: Vec<&str> = rest.split_whitespace().take_while(|w| *w != "#").collect();
                // A command, not prose: local.sh takes the number of GPUs first; the batch
                // script is given to sbatch.
                let words = if launcher.ends_with("local.sh") {
                    match words.first() {
                        Some(n) if n.parse::<usize>().is_ok() || *n == "auto" => &words[1..],
                        _ => continue,
                    }
                } else if line[..pos].contains("sbatch ") {
                    &words[..]
                } else {
                    continue;
                };
                let Some(program) = words.first() else {
                    continue;
                };
                // Usage lines name placeholders (PROGRAM, ARGS...); prose goes on with "(".
                if program.chars().all(|c| c.is_ascii_uppercase() || c == '.') || program.starts_with('(') {
                    continue;
                }
                assert!(
                    program.starts_with("target/") || program.starts_with('"'),
                    "{at}: `{launcher}` must be followed by the program to run, found {program:?}: {line}"
                );
                for w in words.iter().filter(|w| w.starts_with("configs/")) {
                    assert!(root.join(w).is_file(), "{at}: {w} does not exist: {line}");
                }
                checked += 1;
            }
        }
    }
    assert!(checked >= 6, "only {checked} launch commands found");
}
