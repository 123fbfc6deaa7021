//! The `flamia` command line: training, checks, benchmarks, data tools and evaluation.

mod cli;

fn main() -> anyhow::Result<()> {
    cli::run()
}
