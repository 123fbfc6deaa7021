//! Shard discovery and reading: resolve paths/directories/globs/`embedded:*` into shards, read
//! their footers into units (a parquet row group, or a chunk of a pre-tokenised shard), and read
//! one unit at a time into documents. Only one unit is decoded at once, so memory is bounded by the
//! largest row group whatever the shard size.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow::array::{Array, AsArray, RecordBatch};
use arrow::datatypes::DataType;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::arrow::ProjectionMask;
use parquet::file::reader::ChunkReader;

use crate::embedded;
use crate::error::{DataError, Result};
use crate::tokshard;

/// Columns of the FineWeb-Edu schema (only `text` is required; filters need theirs).
pub const FINEWEB_COLUMNS: [&str; 10] = [
    "text",
    "id",
    "dump",
    "url",
    "file_path",
    "language",
    "language_score",
    "token_count",
    "score",
    "int_score",
];

/// Where a shard's bytes live.
#[derive(Debug, Clone)]
pub enum ShardSource {
    /// A file on disk.
    File(PathBuf),
    /// A shard compiled into the binary (`embedded:train`, `embedded:val`).
    Embedded {
        name: &'static str,
        bytes: &'static [u8],
    },
}

impl ShardSource {
    /// The path (or `embedded:*` name) used in messages and fingerprints.
    pub fn path(&self) -> PathBuf {
        match self {
            ShardSource::File(p) => p.clone(),
            ShardSource::Embedded { name, .. } => PathBuf::from(name),
        }
    }

    fn is_tok(&self) -> bool {
        matches!(self, ShardSource::File(p) if p.extension().is_some_and(|e| e == "ftok"))
    }
}

/// Filters applied to every parquet row while reading.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Filters {
    /// Minimum `int_score` kept.
    pub min_int_score: Option<i64>,
    /// Required `language`.
    pub language: Option<String>,
}

/// A shard with its unit sizes, read from the footer/header only.
#[derive(Debug, Clone)]
pub struct Shard {
    /// Where it lives.
    pub source: ShardSource,
    /// Pre-tokenised (`.ftok`) rather than parquet.
    pub tokenized: bool,
    /// Rows (documents) of each unit, in file order.
    pub unit_rows: Vec<usize>,
    /// Tokenizer fingerprint stored in a pre-tokenised shard.
    pub token_fingerprint: Option<String>,
}

/// One document as read from a shard.
#[derive(Debug, Clone, PartialEq)]
pub enum RawDoc {
    /// Text still to tokenise (parquet).
    Text(String),
    /// Token ids without end-of-text (pre-tokenised shard).
    Tokens(Vec<u32>),
}

/// Expands specs into shard sources in a stable order (spec order; sorted within a directory or
/// glob). Missing paths are errors, or skipped with a warning when `skip_bad` is set.
pub fn resolve(specs: &[String], skip_bad: bool) -> Result<Vec<ShardSource>> {
    let mut out = Vec::new();
    for spec in specs {
        let found = resolve_one(spec);
        match found {
            Ok(v) if !v.is_empty() => out.extend(v),
            Ok(_) => {
                let e = DataError::NoShards { spec: spec.clone() };
                if !skip_bad {
                    return Err(e);
                }
                tracing::warn!("skipping: {e}");
            }
            Err(e) if skip_bad => tracing::warn!("skipping: {e}"),
            Err(e) => return Err(e),
        }
    }
    Ok(out)
}

fn resolve_one(spec: &str) -> Result<Vec<ShardSource>> {
    if let Some(name) = spec.strip_prefix("embedded:") {
        return embedded::source(name)
            .map(|s| vec![s])
            .ok_or_else(|| DataError::NoShards { spec: spec.into() });
    }
    let is_shard = |p: &Path| p.extension().is_some_and(|e| e == "parquet" || e == "ftok");
    let p = Path::new(spec);
    if p.is_dir() {
        let rd = std::fs::read_dir(p).map_err(|e| DataError::Open {
            path: p.into(),
            source: e,
        })?;
        let mut v: Vec<PathBuf> = rd
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.is_file() && is_shard(p))
            .collect();
        v.sort();
        return Ok(v.into_iter().map(ShardSource::File).collect());
    }
    if p.exists() {
        return Ok(vec![ShardSource::File(p.into())]);
    }
    if spec.contains(['*', '?', '[']) {
        let paths = glob::glob(spec).map_err(|e| DataError::Config(format!("bad glob `{spec}`: {e}")))?;
        let mut v: Vec<PathBuf> = paths.filter_map(|r| r.ok()).filter(|p| p.is_file()).collect();
        v.sort();
        return Ok(v.into_iter().map(ShardSource::File).collect());
    }
    Err(DataError::Open {
        path: p.into(),
        source: std::io::Error::new(std::io::ErrorKind::NotFound, "no such file or directory"),
    })
}

/// Reads footers/headers and returns the usable shards. Bad shards (unreadable, corrupt, empty,
/// without `text`, or without a column a filter needs) are errors, or skipped when `skip_bad`.
pub fn open_all(sources: Vec<ShardSource>, filters: &Filters, skip_bad: bool) -> Result<Vec<Shard>> {
    let mut out = Vec::with_capacity(sources.len());
    for s in sources {
        match open(&s, filters) {
            Ok(shard) => out.push(shard),
            Err(e) if skip_bad => tracing::warn!("skipping bad shard: {e}"),
            Err(e) => return Err(e),
        }
    }
    Ok(out)
}

/// Reads one shard's footer (parquet) or header (pre-tokenised) and checks its columns.
pub fn open(source: &ShardSource, filters: &Filters) -> Result<Shard> {
    let path = source.path();
    let mut token_fingerprint = None;
    let unit_rows = if source.is_tok() {
        let r = tokshard::TokReader::open(&path)?;
        token_fingerprint = Some(r.fingerprint.clone());
        r.unit_rows()
    } else {
        match source {
            ShardSource::File(p) => parquet_units(&path, open_file(p)?, filters)?,
            ShardSource::Embedded { bytes, .. } => {
                parquet_units(&path, bytes::Bytes::from_static(bytes), filters)?
            }
        }
    };
    if unit_rows.iter().sum::<usize>() == 0 {
        return Err(DataError::EmptyShard { path });
    }
    Ok(Shard {
        source: source.clone(),
        tokenized: source.is_tok(),
        unit_rows,
        token_fingerprint,
    })
}

fn open_file(p: &Path) -> Result<File> {
    File::open(p).map_err(|e| DataError::Open {
        path: p.into(),
        source: e,
    })
}

fn parquet_units<R: ChunkReader + 'static>(path: &Path, r: R, filters: &Filters) -> Result<Vec<usize>> {
    let b = ParquetRecordBatchReaderBuilder::try_new(r).map_err(|e| DataError::Parquet {
        path: path.into(),
        source: e,
    })?;
    column_indices(path, b.schema(), filters)?;
    Ok(b.metadata()
        .row_groups()
        .iter()
        .map(|g| g.num_rows().max(0) as usize)
        .collect())
}

/// Root indices of (text, int_score if filtered, language if filtered), checking types.
fn column_indices(path: &Path, schema: &arrow::datatypes::Schema, f: &Filters) -> Result<[Option<usize>; 3]> {
    let present = || {
        schema
            .fields()
            .iter()
            .map(|f| f.name().as_str())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let find = |name: &str, need: bool, ok: fn(&DataType) -> bool, what: &str| -> Result<Option<usize>> {
        match schema.index_of(name) {
            Ok(i) if ok(schema.field(i).data_type()) => Ok(Some(i)),
            Ok(i) => Err(DataError::Column {
                path: path.into(),
                column: name.into(),
                problem: format!("has type {} but must be {what}", schema.field(i).data_type()),
                present: present(),
            }),
            Err(_) if need => Err(DataError::Column {
                path: path.into(),
                column: name.into(),
                problem: "is missing".into(),
                present: present(),
            }),
            Err(_) => Ok(None),
        }
    };
    let is_str = |t: &DataType| matches!(t, DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View);
    let is_int = |t: &DataType| t.is_integer();
    Ok([
        find("text", true, is_str, "a string")?,
        find("int_score", f.min_int_score.is_some(), is_int, "an integer")?,
        find("language", f.language.is_some(), is_str, "a string")?,
    ])
}

/// Reads unit `unit` of `shard`: one entry per stored row, `None` where a filter (or empty text)
/// drops the row, so row indices stay exact cursors for resuming.
pub fn read_unit(shard: &Shard, unit: usize, filters: &Filters) -> Result<Vec<Option<RawDoc>>> {
    let path = shard.source.path();
    if shard.tokenized {
        let docs = tokshard::TokReader::open(&path)?.read_unit(unit)?;
        return Ok(docs
            .into_iter()
            .map(|d| (!d.is_empty()).then_some(RawDoc::Tokens(d)))
            .collect());
    }
    match &shard.source {
        ShardSource::File(p) => read_parquet_unit(&path, open_file(p)?, unit, filters),
        ShardSource::Embedded { bytes, .. } => {
            read_parquet_unit(&path, bytes::Bytes::from_static(bytes), unit, filters)
        }
    }
}

fn read_parquet_unit<R: ChunkReader + 'static>(
    path: &Path,
    r: R,
    unit: usize,
    filters: &Filters,
) -> Result<Vec<Option<RawDoc>>> {
    let pq = |e| DataError::Parquet {
        path: path.into(),
        source: e,
    };
    let b = ParquetRecordBatchReaderBuilder::try_new(r).map_err(pq)?;
    let cols = column_indices(path, b.schema(), filters)?;
    let wanted: Vec<usize> = cols.iter().flatten().copied().collect();
    let mask = ProjectionMask::roots(b.parquet_schema(), wanted);
    let reader = b
        .with_row_groups(vec![unit])
        .with_projection(mask)
        .with_batch_size(1024)
        .build()
        .map_err(pq)?;
    let mut out = Vec::new();
    for batch in reader {
        let batch = batch.map_err(|e| DataError::Arrow {
            path: path.into(),
            source: e,
        })?;
        push_rows(path, &batch, filters, &mut out)?;
    }
    Ok(out)
}

fn push_rows(path: &Path, batch: &RecordBatch, f: &Filters, out: &mut Vec<Option<RawDoc>>) -> Result<()> {
    let arrow_err = |e| DataError::Arrow {
        path: path.into(),
        source: e,
    };
    let text = string_column(batch.column_by_name("text").ok_or_else(|| DataError::Column {
        path: path.into(),
        column: "text".into(),
        problem: "is missing".into(),
        present: String::new(),
    })?)
    .map_err(arrow_err)?;
    let score = match (f.min_int_score, batch.column_by_name("int_score")) {
        (Some(_), Some(c)) => Some(arrow::compute::cast(c, &DataType::Int64).map_err(arrow_err)?),
        _ => None,
    };
    let score = score
        .as_ref()
        .map(|c| c.as_primitive::<arrow::datatypes::Int64Type>());
    let lang = match (&f.language, batch.column_by_name("language")) {
        (Some(_), Some(c)) => Some(string_column(c).map_err(arrow_err)?),
        _ => None,
    };
    for i in 0..batch.num_rows() {
        let mut keep = text.is_valid(i) && !text.value(i).is_empty();
        if let (Some(min), Some(s)) = (f.min_int_score, score) {
            keep &= s.is_valid(i) && s.value(i) >= min;
        }
        if let (Some(want), Some(l)) = (&f.language, &lang) {
            keep &= l.is_valid(i) && l.value(i) == want;
        }
        out.push(keep.then(|| RawDoc::Text(text.value(i).to_owned())));
    }
    Ok(())
}

/// Any string column as a plain `Utf8` array (casts large/view strings).
fn string_column(
    c: &Arc<dyn Array>,
) -> std::result::Result<arrow::array::StringArray, arrow::error::ArrowError> {
    let c = arrow::compute::cast(c, &DataType::Utf8)?;
    Ok(c.as_string::<i32>().clone())
}
