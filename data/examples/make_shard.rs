//! Same as `flamia data make-shard` without building the trainer (no libtorch needed):
//! `cargo run -p flamia-data --example make_shard -- OUT.parquet FILE...`.

use std::path::PathBuf;

fn main() -> Result<(), flamia_data::DataError> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some((out, files)) = args.split_first() else {
        eprintln!("usage: make_shard OUT.parquet FILE...");
        std::process::exit(2);
    };
    let files: Vec<PathBuf> = files.iter().map(PathBuf::from).collect();
    let (rows, bytes) = flamia_data::makeshard::make_shard(
        &files,
        out.as_ref(),
        flamia_data::makeshard::DEFAULT_DOC_CHARS,
        flamia_data::makeshard::DEFAULT_ROWS_PER_GROUP,
    )?;
    println!("wrote {out}: {rows} documents, {bytes} text bytes");
    Ok(())
}
