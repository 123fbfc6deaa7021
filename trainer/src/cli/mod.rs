//! Subcommands of `flamia`. Each lives in its own module; this file only dispatches.

use clap::{Parser, Subcommand};

mod bench;
mod check;
mod check_cuda;
mod compare;
mod data;
mod eval;
mod export;
mod tokenizer;
mod train;

#[derive(Debug, Parser)]
#[command(
    name = "flamia",
    version,
    about = "FLAMIA low-precision attention LLM pretraining"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Pretrain a Llama-3-style model: `flamia train --config configs/tiny-cpu.toml`.
    Train(train::TrainArgs),
    /// Print the version of this flamia build.
    Info,
    /// Checks: `check numerics` (accuracy of each attention path vs exact, leakage figures).
    Check(check::CheckArgs),
    /// Benchmarks on the GPU: `bench attention` (FLAMIA kernels on the anchors' workloads).
    Bench(bench::BenchArgs),
    /// Data tools: make-shard, make-synthetic, inspect, tokenize, bench.
    Data(data::DataArgs),
    /// Tokenizer tools: convert-tiktoken, encode.
    Tokenizer(tokenizer::TokenizerArgs),
    /// Zero-shot tasks and exact-attention validation of a checkpoint; writes RUN/eval.json.
    Eval(eval::EvalArgs),
    /// A/B report of arms (runs or seeds) against the first: loss PNG, validation, differences with intervals.
    Compare(compare::CompareArgs),
    /// Export a checkpoint to Hugging Face LlamaForCausalLM format.
    Export(export::ExportArgs),
}

/// Parses the command line and runs the subcommand.
pub fn run() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        // (with the training progress bar suspended while a line is written)
        .with_writer(|| flamia_trainer::metrics::progress::LogWriter)
        .init();
    match Cli::parse().command {
        Command::Train(a) => train::run(a),
        Command::Info => {
            println!("flamia {}", env!("CARGO_PKG_VERSION"));
            Ok(())
        }
        Command::Check(a) => check::run(a),
        Command::Bench(a) => bench::run(a),
        Command::Data(a) => data::run(a),
        Command::Tokenizer(a) => tokenizer::run(a),
        Command::Eval(a) => eval::run(a),
        Command::Compare(a) => compare::run(a),
        Command::Export(a) => export::run(a),
    }
}
