//! `data::Config`: the typed, validated settings of the data pipeline (a `[data]` table in the run
//! TOML). Defaults train on the embedded Shakespeare shard with the built-in byte tokenizer.

use serde::{Deserialize, Serialize};

use crate::error::{DataError, Result};

/// Settings of the data pipeline. Unknown keys are rejected.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Training shards: parquet (`.parquet`) or pre-tokenised (`.ftok`) files, directories (all
    /// such files at any depth, sorted; names starting with `.` skipped), globs
    /// (`/data/fineweb-edu/sample/10BT/*.parquet`; only `.parquet` / `.ftok` matches are read, and
    /// `*` / `?` do not match names starting with `.`), or
    /// `embedded:train` for the shard compiled into the binary.
    pub train: Vec<String>,
    /// Validation shards, same forms as `train` (`embedded:val` is the held-out embedded shard).
    /// Read in file order, unshuffled, one pass. Must be empty when a part of `train` is held out
    /// (`holdout_fraction` / `holdout_files`): that part is the validation split then.
    pub val: Vec<String>,
    /// Fraction of the training row groups held out for validation (0 = none; at most 0.5).
    /// A row group is held out when a hash of its file name and index falls below the fraction,
    /// so the split does not depend on the other files or on the order they are listed in; at
    /// least one row group is held out (the one of smallest hash) when the fraction is positive.
    /// That fallback is the one exception: it depends on the whole file list, so adding shards
    /// can move it between the splits (see docs/data.md).
    pub holdout_fraction: f64,
    /// Glob patterns (matched against the file name and against the whole path) of training
    /// files held out whole for validation, e.g. `["*-00000-of-*.parquet"]`.
    pub holdout_files: Vec<String>,
    /// `"bytes"` for the built-in byte-level tokenizer (vocab 256 + specials), or the path of a
    /// Hugging Face `tokenizer.json` (e.g. made by `flamia tokenizer convert-tiktoken`).
    pub tokenizer: String,
    /// Tokens per row fed to the model. Each row also carries the next token as the last target.
    pub seq_len: usize,
    /// Rows per batch on each rank (the micro-batch); the trainer may set it from its own settings.
    pub batch_rows: usize,
    /// Documents tokenised together (one block): the granularity of tokenisation and of the resume
    /// state; memory holds one tokenised block.
    pub shuffle_buffer: usize,
    /// Row groups whose documents are shuffled together: each epoch's row-group order is shuffled,
    /// then consecutive groups of this many row groups (of this rank) are read and all their
    /// documents permuted at once. Memory holds this many decoded row groups. 1 shuffles within
    /// each row group only.
    pub shuffle_row_groups: usize,
    /// Shuffle row-group order (per epoch) and documents (across `shuffle_row_groups` row groups).
    /// Validation is never shuffled.
    pub shuffle: bool,
    /// Seed of every shuffle; the same seed gives the same stream.
    pub seed: u64,
    /// Keep only documents whose `int_score` is at least this (FineWeb-Edu scores 0..5); `None`
    /// keeps all. Parquet shards without an `int_score` column are an error when this is set, and
    /// so are pre-tokenised (`.ftok`) shards: filter those at `flamia data tokenize` time.
    pub min_int_score: Option<i64>,
    /// Keep only documents whose `language` column equals this (e.g. `"en"`); `None` keeps all.
    /// Like `min_int_score`, an error with pre-tokenised (`.ftok`) shards.
    pub language: Option<String>,
    /// Longest attention document, in tokens including BOS and end-of-text: a longer document is
    /// split into consecutive pieces of at most this many tokens (nothing is dropped; each piece
    /// is its own attention segment, and a piece's last token still predicts the next piece's
    /// first). `None` keeps whole documents (row edges still cut them). At least 2 when set.
    pub max_doc_tokens: Option<usize>,
    /// Batches prepared ahead by the background thread (bounded queue); at least 1.
    pub prefetch: usize,
    /// Log and skip shards (or row groups) that are missing, corrupt, empty or lack the text
    /// column, instead of failing.
    pub skip_bad_shards: bool,
    /// Tokenizer worker threads of this rank's loader; 0 means all available cores (too many when
    /// several ranks share a node: one or two per rank keep up with a GPU, see docs/data.md).
    pub num_threads: usize,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            train: vec!["embedded:train".into()],
            val: vec!["embedded:val".into()],
            holdout_fraction: 0.0,
            holdout_files: Vec::new(),
            tokenizer: "bytes".into(),
            seq_len: 512,
            batch_rows: 8,
            shuffle_buffer: 256,
            shuffle_row_groups: 8,
            shuffle: true,
            seed: 0,
            min_int_score: None,
            language: None,
            max_doc_tokens: None,
            prefetch: 4,
            skip_bad_shards: false,
            num_threads: 2,
        }
    }
}

impl Config {
    /// Checks every field; the message says which field and what is allowed.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(DataError::Config(m));
        if self.train.is_empty() {
            return bad(
                "`train` is empty: give at least one shard path, directory, glob or `embedded:train`".into(),
            );
        }
        if self.seq_len < 2 || self.seq_len > (1 << 24) {
            return bad(format!("`seq_len` = {} must be in 2..=16777216", self.seq_len));
        }
        if self.batch_rows == 0 {
            return bad("`batch_rows` must be at least 1".into());
        }
        if self.shuffle_buffer == 0 || self.shuffle_buffer > 1 << 20 {
            return bad(format!(
                "`shuffle_buffer` = {} must be in 1..=1048576",
                self.shuffle_buffer
            ));
        }
        if self.shuffle_row_groups == 0 || self.shuffle_row_groups > 4096 {
            return bad(format!(
                "`shuffle_row_groups` = {} must be in 1..=4096",
                self.shuffle_row_groups
            ));
        }
        if !(0.0..=0.5).contains(&self.holdout_fraction) {
            return bad(format!(
                "`holdout_fraction` = {} must be in 0..=0.5",
                self.holdout_fraction
            ));
        }
        for p in &self.holdout_files {
            if let Err(e) = glob::Pattern::new(p) {
                return bad(format!("`holdout_files` pattern `{p}` is not a glob: {e}"));
            }
        }
        if self.holds_out() && !self.val.is_empty() {
            return bad(format!(
                "`val` = {:?} and a held-out part of `train` (holdout_fraction / holdout_files) are both set: \
                 set val = [] to validate on the held-out part, or drop the holdout",
                self.val
            ));
        }
        if self.prefetch == 0 || self.prefetch > 1024 {
            return bad(format!("`prefetch` = {} must be in 1..=1024", self.prefetch));
        }
        if let Some(m) = self.max_doc_tokens {
            if m < 2 {
                return bad(format!(
                    "`max_doc_tokens` = {m} must be at least 2 (one token plus end-of-text) or unset"
                ));
            }
        }
        if let Some(s) = self.min_int_score {
            if !(0..=5).contains(&s) {
                return bad(format!(
                    "`min_int_score` = {s} must be in 0..=5 (FineWeb-Edu scores) or unset"
                ));
            }
        }
        if self.tokenizer.is_empty() {
            return bad("`tokenizer` is empty: use \"bytes\" or the path of a tokenizer.json".into());
        }
        if self.num_threads > 1024 {
            return bad(format!(
                "`num_threads` = {} must be at most 1024 (0 = all cores)",
                self.num_threads
            ));
        }
        Ok(())
    }

    /// Whether part of `train` is held out as the validation split.
    pub fn holds_out(&self) -> bool {
        self.holdout_fraction > 0.0 || !self.holdout_files.is_empty()
    }

    /// Worker threads for tokenisation after resolving 0 to the core count.
    pub fn threads(&self) -> usize {
        if self.num_threads == 0 {
            std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
        } else {
            self.num_threads
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_validate_and_round_trip_toml_like_json() {
        let c = Config::default();
        c.validate().unwrap();
        let s = serde_json::to_string(&c).unwrap();
        assert_eq!(serde_json::from_str::<Config>(&s).unwrap(), c);
    }

    #[test]
    fn unknown_keys_and_bad_values_are_rejected() {
        assert!(serde_json::from_str::<Config>(r#"{"seq_lenn": 3}"#).is_err());
        let c = Config {
            seq_len: 1,
            ..Config::default()
        };
        assert!(c.validate().unwrap_err().to_string().contains("seq_len"));
        let c = Config {
            max_doc_tokens: Some(1),
            ..Config::default()
        };
        assert!(c.validate().unwrap_err().to_string().contains("max_doc_tokens"));
        let c = Config {
            min_int_score: Some(9),
            ..Config::default()
        };
        assert!(c.validate().unwrap_err().to_string().contains("min_int_score"));
        let c = Config {
            train: vec![],
            ..Config::default()
        };
        assert!(c.validate().is_err());
        // A holdout with the default `val` is ambiguous; with val = [] it is the validation split.
        let c = Config {
            holdout_fraction: 0.01,
            ..Config::default()
        };
        assert!(c.validate().unwrap_err().to_string().contains("val = []"));
        let c = Config { val: vec![], ..c };
        c.validate().unwrap();
        let c = Config {
            shuffle_row_groups: 0,
            ..Config::default()
        };
        assert!(c
            .validate()
            .unwrap_err()
            .to_string()
            .contains("shuffle_row_groups"));
    }
}
