//! Shard discovery and reading: resolve paths/directories (searched recursively)/globs/`embedded:*`
//! into shards, read their footers once into units (a parquet row group, or a chunk of a
//! pre-tokenised shard), and read one unit at a time into documents. The parquet footer is parsed
//! when the shard is opened and reused for every row group. Only one unit is decoded at once, so
//! memory is bounded by the largest row group whatever the shard size.
//!
//! The `text` column may be any arrow string type (`Utf8`, `LargeUtf8`, `Utf8View`, a dictionary
//! of strings) or raw bytes (`Binary`, `LargeBinary`, `BinaryView`, dictionaries of them, as
//! writers without the parquet STRING annotation store text); byte rows that are not valid UTF-8
//! are an error naming the file, row group and row, or a counted drop with `skip_bad_shards`.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow::array::{Array, AsArray, RecordBatch};
use arrow::datatypes::DataType;
use parquet::arrow::arrow_reader::{
    ArrowReaderMetadata, ArrowReaderOptions, ParquetRecordBatchReaderBuilder,
};
use parquet::arrow::ProjectionMask;
use parquet::file::reader::ChunkReader;
use serde::{Deserialize, Serialize};

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
    /// The parsed parquet footer and arrow schema (parquet shards), reused for every row group.
    pub parquet: Option<ArrowReaderMetadata>,
}

/// One document as read from a shard.
#[derive(Debug, Clone, PartialEq)]
pub enum RawDoc {
    /// Text still to tokenise (parquet).
    Text(String),
    /// Token ids without end-of-text (pre-tokenised shard).
    Tokens(Vec<u32>),
}

/// Why a stored row yields no document.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DropReason {
    /// `int_score` below `min_int_score` (or null while the filter is on).
    Score,
    /// `language` other than the configured one (or null).
    Language,
    /// Null or empty text (or an empty pre-tokenised document).
    Empty,
    /// A byte (`Binary`) text value that is not valid UTF-8 (only with `skip_bad_shards`).
    BadUtf8,
}

/// A stored row: its document, or why it has none. Row indices stay exact resume cursors.
pub type Slot = std::result::Result<RawDoc, DropReason>;

/// Counts of what the pipeline read but did not train on, by reason.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Drops {
    /// Rows below `min_int_score`.
    pub score: u64,
    /// Rows in another language.
    pub language: u64,
    /// Rows with null or empty text.
    pub empty: u64,
    /// Rows whose text is not valid UTF-8 (skipped with `skip_bad_shards`).
    pub bad_utf8: u64,
    /// Row groups (units) skipped as unreadable (with `skip_bad_shards`).
    pub bad_units: u64,
    /// Rows in those skipped row groups.
    pub bad_unit_rows: u64,
}

impl Drops {
    /// Counts one dropped row.
    pub fn add(&mut self, r: DropReason) {
        match r {
            DropReason::Score => self.score += 1,
            DropReason::Language => self.language += 1,
            DropReason::Empty => self.empty += 1,
            DropReason::BadUtf8 => self.bad_utf8 += 1,
        }
    }

    /// Rows dropped for any reason (skipped row groups' rows included).
    pub fn rows(&self) -> u64 {
        self.score + self.language + self.empty + self.bad_utf8 + self.bad_unit_rows
    }
}

impl std::fmt::Display for Drops {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} rows dropped ({} below min_int_score, {} other language, {} empty, {} not UTF-8, {} in {} unreadable row groups)",
            self.rows(),
            self.score,
            self.language,
            self.empty,
            self.bad_utf8,
            self.bad_unit_rows,
            self.bad_units
        )
    }
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
    let p = Path::new(spec);
    if p.is_dir() {
        let mut v = Vec::new();
        walk(p, &mut v)?;
        v.sort();
        return Ok(v.into_iter().map(ShardSource::File).collect());
    }
    if p.exists() {
        return Ok(vec![ShardSource::File(p.into())]);
    }
    if spec.contains(['*', '?', '[']) {
        // `*` and `?` do not match a leading `.` (a `.cache/` directory, `.gitattributes`), as in
        // directories; matched files count only if they are shards (not `README.md`).
        let opts = glob::MatchOptions {
            require_literal_leading_dot: true,
            ..glob::MatchOptions::new()
        };
        let paths =
            glob::glob_with(spec, opts).map_err(|e| DataError::Config(format!("bad glob `{spec}`: {e}")))?;
        let mut v = Vec::new();
        for p in paths.filter_map(|r| r.ok()) {
            if p.is_dir() {
                walk(&p, &mut v)?;
            } else if p.is_file() && is_shard_file(&p) {
                v.push(p);
            }
        }
        v.sort();
        v.dedup();
        return Ok(v.into_iter().map(ShardSource::File).collect());
    }
    Err(DataError::Open {
        path: p.into(),
        source: std::io::Error::new(std::io::ErrorKind::NotFound, "no such file or directory"),
    })
}

/// Whether a file name is a shard the loader reads (`.parquet` or `.ftok`).
pub fn is_shard_file(p: &Path) -> bool {
    p.extension().is_some_and(|e| e == "parquet" || e == "ftok")
}

/// Collects the shard files under `dir` at any depth. Entries whose name starts with `.` are
/// skipped (`.cache/` of Hugging Face downloads holds partial files).
fn walk(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    let rd = std::fs::read_dir(dir).map_err(|e| DataError::Open {
        path: dir.into(),
        source: e,
    })?;
    for e in rd {
        let p = e
            .map_err(|e| DataError::Open {
                path: dir.into(),
                source: e,
            })?
            .path();
        if p.file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with('.'))
        {
            continue;
        }
        if p.is_dir() {
            walk(&p, out)?;
        } else if p.is_file() && is_shard_file(&p) {
            out.push(p);
        }
    }
    Ok(())
}

/// Reads footers/headers and returns the usable shards. Bad shards (unreadable, corrupt, empty,
/// without `text`, or without a column a filter needs) are errors, or skipped when `skip_bad`.
/// A filter with a pre-tokenised shard is a configuration error even with `skip_bad` (see
/// [`check_filters`]).
pub fn open_all(sources: Vec<ShardSource>, filters: &Filters, skip_bad: bool) -> Result<Vec<Shard>> {
    for s in &sources {
        check_filters(s, filters)?;
    }
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

/// Refuses `min_int_score` / `language` for a pre-tokenised (`.ftok`) shard: it keeps only token
/// ids (no `int_score` or `language` column, and its header records no filter), so the filter
/// could not be applied; `flamia data tokenize --min-int-score/--language` filters when the shard
/// is made.
pub fn check_filters(source: &ShardSource, filters: &Filters) -> Result<()> {
    if !source.is_tok() || *filters == Filters::default() {
        return Ok(());
    }
    let mut set = Vec::new();
    if let Some(m) = filters.min_int_score {
        set.push(format!("min_int_score = {m}"));
    }
    if let Some(l) = &filters.language {
        set.push(format!("language = {l:?}"));
    }
    Err(DataError::Config(format!(
        "{} cannot apply to pre-tokenised shard {}: .ftok shards hold only token ids, so filters apply at \
         `flamia data tokenize --min-int-score N --language L` time; unset them for .ftok shards \
         (or train on the parquet shards)",
        set.join(" and "),
        source.path().display()
    )))
}

/// Reads one shard's footer (parquet) or header (pre-tokenised) and checks its columns (and that
/// no filter is set for a pre-tokenised shard).
pub fn open(source: &ShardSource, filters: &Filters) -> Result<Shard> {
    check_filters(source, filters)?;
    let path = source.path();
    if let ShardSource::File(p) = source {
        let len = std::fs::metadata(p)
            .map_err(|e| DataError::Open {
                path: p.clone(),
                source: e,
            })?
            .len();
        if len == 0 {
            return Err(DataError::EmptyFile { path });
        }
    }
    let mut token_fingerprint = None;
    let mut parquet = None;
    let unit_rows = if source.is_tok() {
        let r = tokshard::TokReader::open(&path)?;
        token_fingerprint = Some(r.fingerprint.clone());
        r.unit_rows()
    } else {
        let meta = match source {
            ShardSource::File(p) => load_meta(&path, &open_file(p)?)?,
            ShardSource::Embedded { bytes, .. } => load_meta(&path, &bytes::Bytes::from_static(bytes))?,
        };
        column_indices(&path, meta.schema(), filters)?;
        let rows = meta
            .metadata()
            .row_groups()
            .iter()
            .map(|g| g.num_rows().max(0) as usize)
            .collect();
        parquet = Some(meta);
        rows
    };
    if unit_rows.iter().sum::<usize>() == 0 {
        return Err(DataError::EmptyShard { path });
    }
    Ok(Shard {
        source: source.clone(),
        tokenized: source.is_tok(),
        unit_rows,
        token_fingerprint,
        parquet,
    })
}

fn open_file(p: &Path) -> Result<File> {
    File::open(p).map_err(|e| DataError::Open {
        path: p.into(),
        source: e,
    })
}

/// Parses the footer (and the arrow schema it carries) once.
fn load_meta<R: ChunkReader>(path: &Path, r: &R) -> Result<ArrowReaderMetadata> {
    ArrowReaderMetadata::load(r, ArrowReaderOptions::default()).map_err(|e| DataError::Parquet {
        path: path.into(),
        source: e,
    })
}

/// Arrow types the `text` (and `language`) column may have: strings, bytes, dictionaries of them.
fn is_text_type(t: &DataType) -> bool {
    match t {
        DataType::Utf8
        | DataType::LargeUtf8
        | DataType::Utf8View
        | DataType::Binary
        | DataType::LargeBinary
        | DataType::BinaryView => true,
        DataType::Dictionary(_, v) => is_text_type(v),
        _ => false,
    }
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
    let is_int = |t: &DataType| t.is_integer();
    Ok([
        find(
            "text",
            true,
            is_text_type,
            "a string or binary column (or a dictionary of them)",
        )?,
        find("int_score", f.min_int_score.is_some(), is_int, "an integer")?,
        find("language", f.language.is_some(), is_text_type, "a string column")?,
    ])
}

/// Reads unit `unit` of `shard`: one entry per stored row, `None` where a filter (or empty text)
/// drops the row, so row indices stay exact cursors for resuming. Non-UTF-8 byte text is an error.
pub fn read_unit(shard: &Shard, unit: usize, filters: &Filters) -> Result<Vec<Option<RawDoc>>> {
    Ok(read_slots(shard, unit, filters, false)?
        .into_iter()
        .map(|s| s.ok())
        .collect())
}

/// Like [`read_unit`], with the reason of every dropped row. With `skip_bad_utf8` a byte text value
/// that is not UTF-8 is dropped as [`DropReason::BadUtf8`] instead of failing the unit.
pub fn read_slots(shard: &Shard, unit: usize, filters: &Filters, skip_bad_utf8: bool) -> Result<Vec<Slot>> {
    let path = shard.source.path();
    if shard.tokenized {
        check_filters(&shard.source, filters)?;
        let docs = tokshard::TokReader::open(&path)?.read_unit(unit)?;
        return Ok(docs
            .into_iter()
            .map(|d| {
                if d.is_empty() {
                    Err(DropReason::Empty)
                } else {
                    Ok(RawDoc::Tokens(d))
                }
            })
            .collect());
    }
    let meta = match &shard.parquet {
        Some(m) => m.clone(),
        None => match &shard.source {
            ShardSource::File(p) => load_meta(&path, &open_file(p)?)?,
            ShardSource::Embedded { bytes, .. } => load_meta(&path, &bytes::Bytes::from_static(bytes))?,
        },
    };
    let ctx = UnitCtx {
        path: &path,
        unit,
        filters,
        skip_bad_utf8,
    };
    match &shard.source {
        ShardSource::File(p) => read_parquet_unit(&ctx, open_file(p)?, meta),
        ShardSource::Embedded { bytes, .. } => {
            read_parquet_unit(&ctx, bytes::Bytes::from_static(bytes), meta)
        }
    }
}

struct UnitCtx<'a> {
    path: &'a Path,
    unit: usize,
    filters: &'a Filters,
    skip_bad_utf8: bool,
}

fn read_parquet_unit<R: ChunkReader + 'static>(
    ctx: &UnitCtx<'_>,
    r: R,
    meta: ArrowReaderMetadata,
) -> Result<Vec<Slot>> {
    let (path, unit, filters) = (ctx.path, ctx.unit, ctx.filters);
    let pq = |e| DataError::Parquet {
        path: path.into(),
        source: e,
    };
    if unit >= meta.metadata().num_row_groups() {
        return Err(DataError::NoData(format!(
            "{}: row group {unit} of {}",
            path.display(),
            meta.metadata().num_row_groups()
        )));
    }
    let b = ParquetRecordBatchReaderBuilder::new_with_metadata(r, meta);
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
        push_rows(ctx, &batch, &mut out)?;
    }
    Ok(out)
}

/// The text column of a batch as UTF-8 strings or raw bytes.
enum TextColumn {
    Str(arrow::array::StringArray),
    Bin(arrow::array::BinaryArray),
}

impl TextColumn {
    fn of(c: &Arc<dyn Array>) -> std::result::Result<Self, arrow::error::ArrowError> {
        let bytes =
            |t: &DataType| matches!(t, DataType::Binary | DataType::LargeBinary | DataType::BinaryView);
        let is_bin = match c.data_type() {
            DataType::Dictionary(_, v) => bytes(v),
            t => bytes(t),
        };
        Ok(if is_bin {
            let c = arrow::compute::cast(c, &DataType::Binary)?;
            TextColumn::Bin(c.as_binary::<i32>().clone())
        } else {
            TextColumn::Str(string_column(c)?)
        })
    }

    /// Row `i`: `None` if null, `Some(Err(pos))` if bytes are not UTF-8 (at byte `pos`).
    fn get(&self, i: usize) -> Option<std::result::Result<&str, usize>> {
        match self {
            TextColumn::Str(a) => a.is_valid(i).then(|| Ok(a.value(i))),
            TextColumn::Bin(a) => a
                .is_valid(i)
                .then(|| std::str::from_utf8(a.value(i)).map_err(|e| e.valid_up_to())),
        }
    }
}

fn push_rows(ctx: &UnitCtx<'_>, batch: &RecordBatch, out: &mut Vec<Slot>) -> Result<()> {
    let (path, f) = (ctx.path, ctx.filters);
    let arrow_err = |e| DataError::Arrow {
        path: path.into(),
        source: e,
    };
    let text = TextColumn::of(batch.column_by_name("text").ok_or_else(|| DataError::Column {
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
        if let (Some(min), Some(s)) = (f.min_int_score, score) {
            if !(s.is_valid(i) && s.value(i) >= min) {
                out.push(Err(DropReason::Score));
                continue;
            }
        }
        if let (Some(want), Some(l)) = (&f.language, &lang) {
            if !(l.is_valid(i) && l.value(i) == want) {
                out.push(Err(DropReason::Language));
                continue;
            }
        }
        out.push(match text.get(i) {
            None => Err(DropReason::Empty),
            Some(Ok("")) => Err(DropReason::Empty),
            Some(Ok(t)) => Ok(RawDoc::Text(t.to_owned())),
            Some(Err(_)) if ctx.skip_bad_utf8 => Err(DropReason::BadUtf8),
            Some(Err(at)) => {
                return Err(DataError::NotUtf8 {
                    path: path.into(),
                    row_group: ctx.unit,
                    row: out.len(),
                    byte: at,
                })
            }
        });
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
