//! `flamia train`: resolve the config (preset, environment, `--set`), train, print the summary.

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use flamia_trainer::config::TrainConfig;
use flamia_trainer::train::{train, RunOptions};
use flamia_trainer::TrainError;

#[derive(Debug, Args)]
pub struct TrainArgs {
    /// TOML preset (configs/tiny-cpu.toml, configs/h200-125m.toml, ...); defaults apply without one.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Override one key, `section.key=value` (repeatable), e.g. `--set training.steps=50`.
    #[arg(long = "set", value_name = "SECTION.KEY=VALUE")]
    pub set: Vec<String>,
    /// Continue from the newest checkpoint in the run directory.
    #[arg(long, conflicts_with = "overwrite")]
    pub resume: bool,
    /// Start afresh in a run directory that holds an earlier run's checkpoints, deleting them
    /// (without it such a start is refused).
    #[arg(long)]
    pub overwrite: bool,
    /// Stop after this many optimizer steps of this invocation (a checkpoint is written).
    #[arg(long)]
    pub stop_after: Option<usize>,
    /// Print the resolved config as TOML and exit.
    #[arg(long)]
    pub print_config: bool,
}

pub fn run(a: TrainArgs) -> anyhow::Result<()> {
    let cfg = TrainConfig::load(a.config.as_deref(), &a.set).context("resolving the run configuration")?;
    if a.print_config {
        print!("{}", cfg.to_toml()?);
        return Ok(());
    }
    let s = match train(
        &cfg,
        &RunOptions {
            resume: a.resume,
            stop_after: a.stop_after,
            overwrite: a.overwrite,
        },
    ) {
        // `--resume` of a finished run (e.g. a requeued job): nothing to do, not a failure
        Err(TrainError::Complete(msg)) => {
            println!("{msg}");
            return Ok(());
        }
        // the group failed under this rank: a status of its own for the launcher (the error
        // names the rank that failed first)
        Err(e @ TrainError::PeerFailure(_)) => {
            eprintln!("Error: training run in {}: {e}", cfg.run_dir().display());
            std::process::exit(flamia_dist::PEER_FAILURE_EXIT_CODE);
        }
        r => r.with_context(|| format!("training run in {}", cfg.run_dir().display()))?,
    };
    println!(
        "run {} | attention {} | {} | steps {} (skipped {}) | loss {:.4} -> {:.4} (last-10% mean {:.4}){} | {:.0} tok/s{} | peak mem {:.2} GiB | attention {:.0}% of time | {:.1} s",
        s.run_dir.display(),
        s.attention_path,
        s.device,
        s.steps,
        s.skipped_steps,
        s.first_loss,
        s.final_loss,
        s.tail_mean_loss,
        s.val_losses
            .last()
            .map(|(step, v)| {
                // (the bf16 path's own validation is the exact one: nothing to add)
                let own_is_exact = matches!(
                    flamia_trainer::attention::parse_path(&s.attention_path),
                    Ok(flamia_kernels::AttnPath::Exact)
                );
                let exact = s.val_losses_exact.last().filter(|e| e.0 == *step && !own_is_exact);
                let exact = exact.map(|e| format!(" (exact attention {:.4})", e.1)).unwrap_or_default();
                format!(" | validation loss {v:.4}{exact} at step {step}")
            })
            .unwrap_or_default(),
        s.mean_tps,
        s.mean_mfu_pct.map(|m| format!(" | MFU {m:.1}%")).unwrap_or_default(),
        s.peak_memory_gib,
        100.0 * s.attn_share,
        s.wall_s
    );
    if let Some(why) = &s.stopped_by {
        // Every rank checkpointed and left the group: tell the launcher to requeue.
        eprintln!(
            "stopped at step {} on {why}, checkpoint written; exiting with {} (continue with --resume)",
            s.steps,
            flamia_dist::PREEMPTED_EXIT_CODE
        );
        std::process::exit(flamia_dist::PREEMPTED_EXIT_CODE);
    }
    Ok(())
}
