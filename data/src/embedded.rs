//! The default data compiled into the binary: a FineWeb-Edu-schema train shard and a held-out
//! validation shard of public-domain Shakespeare (see `data/README.md` for source, licence and the
//! `flamia data make-shard` commands that rebuild them byte for byte).

use crate::source::ShardSource;

/// `data/shards/train.parquet`.
pub static TRAIN: &[u8] = include_bytes!("../shards/train.parquet");
/// `data/shards/val.parquet`.
pub static VAL: &[u8] = include_bytes!("../shards/val.parquet");

/// The embedded shard called `name` (`train` or `val`).
pub fn source(name: &str) -> Option<ShardSource> {
    match name {
        "train" => Some(ShardSource::Embedded {
            name: "embedded:train",
            bytes: TRAIN,
        }),
        "val" => Some(ShardSource::Embedded {
            name: "embedded:val",
            bytes: VAL,
        }),
        _ => None,
    }
}
