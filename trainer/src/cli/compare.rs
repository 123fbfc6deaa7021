//! `flamia compare ARM...`: A/B report of arms (one or more runs each, e.g. seeds) against the
//! first (the control): smoothed loss curves with a run-minus-control panel (PNG), loss
//! summaries, exact-attention validation, task scores; per metric the arms' mean ± sd over runs
//! and arm − control differences with a 95% Welch t interval from the seed spread (paired
//! bootstrap task differences when every arm has one run).

use anyhow::Context;
use flamia_eval::compare::{self, CompareOptions};
use std::path::PathBuf;

#[derive(Debug, clap::Args)]
pub struct CompareArgs {
    /// Arms, the control first: `DIR`, `DIR1,DIR2,...` (several runs, e.g. seeds) or
    /// `LABEL=DIR1,DIR2,...` (default label: the first directory's name).
    #[arg(required = true, num_args = 2..)]
    arms: Vec<String>,
    /// Directory for `compare.md` and `loss.png`.
    #[arg(long, default_value = "compare")]
    out: PathBuf,
    /// Average the last N logged losses.
    #[arg(long, default_value_t = 50)]
    last_n: usize,
}

pub fn run(a: CompareArgs) -> anyhow::Result<()> {
    let arms = compare::load_arms(&a.arms).context("reading the run directories")?;
    let w = compare::write(
        &arms,
        &CompareOptions {
            last_n: a.last_n,
            out_dir: a.out.clone(),
        },
    )
    .with_context(|| format!("writing the report into {}", a.out.display()))?;
    print!(
        "{}",
        std::fs::read_to_string(&w.markdown).context("reading back the report")?
    );
    eprintln!("wrote {} and {}", w.markdown.display(), w.png.display());
    Ok(())
}
