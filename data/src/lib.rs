//! Training data for flamia: stream FineWeb-Edu parquet shards, tokenise, pack documents into rows
//! of `seq_len` tokens with their `cu_seqlens`, give each data-parallel rank a disjoint share, and
//! resume exactly from a small serialisable state.
//!
//! # Using it from the trainer
//! ```no_run
//! use flamia_data::{Config, DataState, Loader};
//! # fn main() -> Result<(), flamia_data::DataError> {
//! let cfg = Config::default(); // embedded Shakespeare shards, byte tokenizer
//! let saved: Option<DataState> = None; // or the state stored in the checkpoint
//! let mut loader = Loader::new(&cfg, /*rank*/ 0, /*world_size*/ 1, saved)?;
//! let vocab = loader.vocab_size(); // 258 for the byte tokenizer
//! let batch = loader.next_batch()?.expect("training never ends");
//! assert_eq!(batch.tokens.len(), batch.rows * batch.seq_len);
//! // inputs `batch.tokens`, targets `batch.targets` (-100 = ignore), per-row `batch.cu_seqlens`
//! let to_checkpoint = loader.state(); // serde: resumes exactly after `batch`
//! # let _ = (vocab, to_checkpoint); Ok(()) }
//! ```
//!
//! * Rows carry `seq_len` inputs and `seq_len` targets (the next token; the row's last target is
//!   the first token of the next row). Every document is `[BOS] + text + [EOS]` (BOS where the
//!   tokenizer has one; the byte tokenizer's is 257); the target at an end-of-text position is
//!   [`IGNORE_INDEX`] because document masking hides the next document. `max_doc_tokens` splits
//!   longer documents into pieces; nothing is truncated.
//! * Ranks get disjoint row groups (each epoch's shuffled unit list is dealt round robin); with
//!   fewer row groups than ranks, every world-th document.
//! * Documents are shuffled across `shuffle_row_groups` row groups at a time.
//! * [`DataState`] is a few integers: `(epoch, block, block start, piece, token)` plus a
//!   fingerprint of shards/tokenizer/settings; all randomness derives from `(seed, epoch, group)`.

pub mod atomic;
pub mod bench;
pub mod config;
pub mod embedded;
pub mod error;
pub mod inspect;
pub mod loader;
pub mod makeshard;
pub mod pretokenize;
pub mod source;
pub mod stream;
pub mod tiktoken;
pub mod tokenizer;
pub mod tokshard;

pub use config::Config;
pub use error::{DataError, Result};
pub use loader::{Batch, Loader, LoaderStats};
pub use source::Drops;
pub use stream::{Cursor, DataState, Plan, Row, IGNORE_INDEX};
pub use tokenizer::Tokenizer;
