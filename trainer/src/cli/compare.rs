//! `flamia compare RUN...`: A/B report of runs against the first (the control): loss curves PNG,
//! loss summaries, exact-attention validation, task accuracies with paired bootstrap differences.

use anyhow::Context;
use flamia_eval::compare::{self, CompareOptions};
use std::path::PathBuf;

#[derive(Debug, clap::Args)]
pub struct CompareArgs {
    /// Run directories, the control first; `LABEL=DIR` sets the label (default: directory name).
    #[arg(required = true, num_args = 2..)]
    runs: Vec<String>,
    /// Directory for `compare.md` and `loss.png`.
    #[arg(long, default_value = "compare")]
    out: PathBuf,
    /// Average the last N logged losses.
    #[arg(long, default_value_t = 50)]
    last_n: usize,
}

pub fn run(a: CompareArgs) -> anyhow::Result<()> {
    let runs = compare::load_runs(&a.runs).context("reading the run directories")?;
    let w = compare::write(
        &runs,
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
