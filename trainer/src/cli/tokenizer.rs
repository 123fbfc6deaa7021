//! `flamia tokenizer ...`: convert tiktoken rank files into a Hugging Face `tokenizer.json`, and
//! encode text with any tokenizer the data pipeline accepts.

use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, Subcommand};
use flamia_data::Tokenizer;

/// `flamia tokenizer` arguments.
#[derive(Debug, Args)]
pub struct TokenizerArgs {
    #[command(subcommand)]
    cmd: TokCmd,
}

#[derive(Debug, Subcommand)]
enum TokCmd {
    /// Convert a tiktoken rank file (e.g. Llama-3's tokenizer.model) into tokenizer.json with
    /// Llama-3's 256 special tokens after the base vocabulary.
    ConvertTiktoken {
        /// The rank file: `<base64 token> <rank>` per line.
        #[arg(long)]
        ranks: PathBuf,
        /// Pre-tokenisation pattern: `llama3`, or `regex:<pattern>`.
        #[arg(long, default_value = "llama3")]
        pattern: String,
        /// Output tokenizer.json.
        #[arg(long)]
        out: PathBuf,
    },
    /// Print the ids of TEXT (and the decoded text) under a tokenizer.
    Encode {
        /// "bytes" or a tokenizer.json.
        #[arg(long, default_value = "bytes")]
        tokenizer: String,
        /// Text to encode.
        text: String,
    },
}

/// Runs `flamia tokenizer ...`.
pub fn run(args: TokenizerArgs) -> anyhow::Result<()> {
    match args.cmd {
        TokCmd::ConvertTiktoken { ranks, pattern, out } => {
            let vocab = flamia_data::tiktoken::convert(&ranks, &pattern, &out)
                .with_context(|| format!("convert {} into {}", ranks.display(), out.display()))?;
            println!(
                "wrote {}: vocabulary {vocab} (with 256 special tokens)",
                out.display()
            );
        }
        TokCmd::Encode { tokenizer, text } => {
            let tok = Tokenizer::from_spec(&tokenizer)?;
            let ids = tok.encode(&text)?;
            println!("{}", serde_json::to_string(&ids)?);
            println!("{}", tok.decode(&ids)?);
        }
    }
    Ok(())
}
