//! Same as `flamia data make-shard` without building the trainer (no libtorch needed):
//! `cargo run -p flamia-data --example make_shard -- OUT.parquet FILE...`, or
//! `... -- --jsonl IN.jsonl OUT.parquet [ROWS_PER_GROUP]` for one document per JSON line.

use std::path::PathBuf;

fn main() -> Result<(), flamia_data::DataError> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--jsonl") {
        let (Some(input), Some(out)) = (args.get(1), args.get(2)) else {
            eprintln!("usage: make_shard --jsonl IN.jsonl OUT.parquet [ROWS_PER_GROUP]");
            std::process::exit(2);
        };
        let rows_per_group = match args.get(3).map(|r| r.parse::<usize>()) {
            Some(Ok(r)) => r,
            Some(Err(_)) => {
                eprintln!("ROWS_PER_GROUP must be an integer");
                std::process::exit(2);
            }
            None => flamia_data::makeshard::DEFAULT_ROWS_PER_GROUP,
        };
        let (rows, bytes) =
            flamia_data::makeshard::make_shard_jsonl(input.as_ref(), out.as_ref(), rows_per_group)?;
        println!("wrote {out}: {rows} documents, {bytes} text bytes");
        return Ok(());
    }
    let Some((out, files)) = args.split_first() else {
        eprintln!("usage: make_shard OUT.parquet FILE...  |  make_shard --jsonl IN.jsonl OUT.parquet [ROWS_PER_GROUP]");
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
