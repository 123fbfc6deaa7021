//! `flamia-dist`: launch diagnostics for the distributed layer, and the child process of the
//! multi-process tests.
//!
//! - `flamia-dist rendezvous`: join the group from the launcher's environment, print one JSON line
//!   (rank, world size, a digest of the published id, hosts); with `--steps`, run that many
//!   barrier-separated steps with heartbeats (`--die-rank/--die-at-step` kill one rank to test
//!   failure detection).
//! - `flamia-dist nccl-check`: rendezvous, then an NCCL all-reduce on `cuda:<LOCAL_RANK>`,
//!   verified and timed (bus bandwidth).
//! - `flamia-dist topology`: print, as one JSON line, the placement this process would take from
//!   its environment (rank, world size, local rank, device, rendezvous endpoint, which launcher's
//!   variables), without joining anything: what a launcher gives each task.

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use flamia_dist::{nccl::NcclId, GroupOptions, ProcessGroup, Topology, PEER_FAILURE_EXIT_CODE};

#[derive(Parser)]
#[command(
    name = "flamia-dist",
    version,
    about = "flamia distributed launch diagnostics"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
    /// Rendezvous join timeout, seconds (default: FLAMIA_DIST_JOIN_TIMEOUT_S or 600).
    #[arg(long, global = true)]
    join_timeout: Option<f64>,
    /// Heartbeat timeout, seconds (default: FLAMIA_DIST_HEARTBEAT_TIMEOUT_S or 60).
    #[arg(long, global = true)]
    heartbeat_timeout: Option<f64>,
}

#[derive(Subcommand)]
enum Cmd {
    /// Join the group, print the result, optionally run barrier steps.
    Rendezvous {
        /// Barrier-separated steps to run after joining.
        #[arg(long, default_value_t = 0)]
        steps: usize,
        /// Milliseconds of "work" per step.
        #[arg(long, default_value_t = 50)]
        step_ms: u64,
        /// This rank aborts (SIGABRT, no goodbye) at `--die-at-step`.
        #[arg(long)]
        die_rank: Option<usize>,
        #[arg(long, default_value_t = 0)]
        die_at_step: usize,
        /// This rank panics (unwinding, as a failed tch call does) at `--die-at-step`.
        #[arg(long)]
        panic_rank: Option<usize>,
        /// SIGTERM/SIGUSR1 stop the run: the ranks vote every step (one rank's signal is enough),
        /// all stop at the same step and exit with 75 (what `flamia train` does after its
        /// checkpoint).
        #[arg(long)]
        stop_on_signal: bool,
    },
    /// Print this process's placement (from the launcher's variables) as JSON; joins nothing.
    Topology,
    /// NCCL all-reduce check and bandwidth on the GPUs.
    NcclCheck {
        /// Buffer size in MiB.
        #[arg(long, default_value_t = 256)]
        mib: usize,
        #[arg(long, default_value_t = 20)]
        iters: usize,
    },
}

fn main() {
    let cli = Cli::parse();
    if let Err(e) = run(cli) {
        eprintln!("error: {e:#}");
        let peer = e
            .chain()
            .any(|c| c.downcast_ref::<flamia_dist::DistError>().is_some());
        std::process::exit(if peer { PEER_FAILURE_EXIT_CODE } else { 1 });
    }
}

fn digest(bytes: &[u8]) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h = (h ^ b as u64).wrapping_mul(0x0100_0000_01b3);
    }
    format!("{h:016x}")
}

fn run(cli: Cli) -> Result<()> {
    let topo = Topology::from_env().context("reading rank/world size from the environment")?;
    let mut opts = GroupOptions::from_env()?;
    if let Some(s) = cli.join_timeout {
        opts.join_timeout = Duration::from_secs_f64(s);
    }
    if let Some(s) = cli.heartbeat_timeout {
        opts.heartbeat_timeout = Duration::from_secs_f64(s);
        opts.heartbeat_interval = opts.heartbeat_interval.min(opts.heartbeat_timeout / 4);
        opts.exit_grace = opts.exit_grace.map(|g| g.min(opts.heartbeat_timeout));
    }
    let started = Instant::now();
    match cli.cmd {
        Cmd::Rendezvous {
            steps,
            step_ms,
            die_rank,
            die_at_step,
            panic_rank,
            stop_on_signal,
        } => {
            if stop_on_signal {
                flamia_dist::signal::install(&flamia_dist::signal::STOP_SIGNALS)?;
            }
            let pg = ProcessGroup::join(&topo, &opts, || {
                // Not NCCL: any 128 bytes unique to this job exercise the same path.
                let seed = std::process::id() as u64 ^ started.elapsed().as_nanos() as u64;
                Ok((0..128u64)
                    .map(|i| (seed.wrapping_mul(i + 1) >> 7) as u8)
                    .collect())
            })
            .with_context(|| format!("rank {} joining {}", topo.rank, topo.master_endpoint()))?;
            let line = serde_json::json!({
                "event": "joined",
                "rank": pg.rank(),
                "world_size": pg.world_size(),
                "local_rank": topo.local_rank,
                "payload_len": pg.payload().len(),
                "payload_digest": digest(pg.payload()),
                "hosts": pg.hosts(),
                "join_ms": started.elapsed().as_millis() as u64,
            });
            println!("{line}");
            let step_timeout = opts.heartbeat_timeout * 4;
            for step in 0..steps {
                if die_rank == Some(pg.rank()) && step == die_at_step {
                    eprintln!("rank {}: dying at step {step} on purpose", pg.rank());
                    std::process::abort();
                }
                if panic_rank == Some(pg.rank()) && step == die_at_step {
                    panic!("rank {} panicking at step {step} on purpose", pg.rank());
                }
                std::thread::sleep(Duration::from_millis(step_ms));
                pg.health()
                    .check()
                    .with_context(|| format!("rank {} at step {step}", pg.rank()))?;
                if stop_on_signal {
                    let mine = flamia_dist::signal::requested();
                    let stop = pg
                        .store()
                        .vote_any(mine.is_some(), step_timeout)
                        .with_context(|| format!("rank {} at step {step}", pg.rank()))?;
                    if stop {
                        let seen = mine.map(flamia_dist::signal::name);
                        println!(
                            "{}",
                            serde_json::json!({"event": "stopped", "rank": pg.rank(), "step": step, "signal": seen})
                        );
                        pg.shutdown(Duration::from_secs(30)).context("shutdown barrier")?;
                        std::process::exit(flamia_dist::PREEMPTED_EXIT_CODE);
                    }
                    continue;
                }
                pg.store()
                    .barrier(step_timeout)
                    .with_context(|| format!("rank {} at step {step}", pg.rank()))?;
            }
            pg.shutdown(Duration::from_secs(30)).context("shutdown barrier")?;
            println!(
                "{}",
                serde_json::json!({"event": "done", "rank": topo.rank, "steps": steps})
            );
            Ok(())
        }
        Cmd::Topology => {
            println!(
                "{}",
                serde_json::json!({
                    "rank": topo.rank,
                    "world_size": topo.world_size,
                    "local_rank": topo.local_rank,
                    "local_world_size": topo.local_world_size,
                    "device": topo.device,
                    "source": topo.source,
                    "master": topo.master_endpoint(),
                    "job": opts.job_id,
                })
            );
            Ok(())
        }
        Cmd::NcclCheck { mib, iters } => {
            let pg = ProcessGroup::join(&topo, &opts, || Ok(NcclId::new()?.0.to_vec()))
                .with_context(|| format!("rank {} joining {}", topo.rank, topo.master_endpoint()))?;
            let id = NcclId::from_bytes(pg.payload())?;
            let numel = mib * (1 << 20) / 4;
            let report = flamia_dist::gpu_check::all_reduce_check(
                &id,
                pg.rank(),
                pg.world_size(),
                topo.device,
                numel,
                iters,
                Some(pg.health().clone()),
            )?;
            println!("{}", serde_json::to_string(&report)?);
            pg.shutdown(Duration::from_secs(60))?;
            Ok(())
        }
    }
}
