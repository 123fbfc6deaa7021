//! Reading task records from local JSONL or parquet files, and finding a task's file in a data
//! directory.
//!
//! Layout looked up for task `T` (its name, e.g. `arc_easy`) in `--data-dir D`, first match wins:
//! 1. `D/T.jsonl`, `D/T.json` (JSON lines), `D/T.parquet`;
//! 2. the files under `D/T/` (any depth; entries starting with `.` skipped) ending in `.jsonl`,
//!    `.json` or `.parquet` whose name contains the task's split (`validation` or `test`) or that
//!    lie in a directory named after the split, in path order. A Hugging Face dataset snapshot
//!    (`huggingface-cli download ... --local-dir D/T`) has this shape:
//!    `ARC-Easy/test-00000-of-00001.parquet`, or `<config>/<split>/0000.parquet` in the
//!    `refs/convert/parquet` revision. When the files belong to several configurations (the
//!    directory above the split, e.g. `ARC-Easy` and `ARC-Challenge`), the task's own
//!    ([`Task::configs`]) is taken; with none of them, the ambiguity is an error listing them.

use crate::error::{Error, Result};
use crate::tasks::Task;
use parquet::file::reader::{FileReader, SerializedFileReader};
use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};

/// Reads every record of a `.jsonl`/`.json` (one JSON object per line) or `.parquet` file, at most
/// `limit` of them.
pub fn read_records(path: &Path, limit: Option<usize>) -> Result<Vec<Value>> {
    let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("");
    match ext {
        "jsonl" | "json" => read_jsonl(path, limit),
        "parquet" => read_parquet(path, limit),
        _ => Err(Error::Invalid(format!(
            "{}: unknown record file type {ext:?}; allowed: .jsonl, .json (JSON lines), .parquet",
            path.display()
        ))),
    }
}

fn read_jsonl(path: &Path, limit: Option<usize>) -> Result<Vec<Value>> {
    let file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    let mut out = Vec::new();
    for (i, line) in BufReader::new(file).lines().enumerate() {
        if limit.is_some_and(|l| out.len() >= l) {
            break;
        }
        let line = line.map_err(|e| Error::io(path, e))?;
        if line.trim().is_empty() {
            continue;
        }
        let v: Value = serde_json::from_str(&line).map_err(|e| Error::Json {
            path: path.into(),
            line: i + 1,
            msg: e.to_string(),
        })?;
        out.push(v);
    }
    Ok(out)
}

fn read_parquet(path: &Path, limit: Option<usize>) -> Result<Vec<Value>> {
    let perr = |e: parquet::errors::ParquetError| Error::Parquet {
        path: path.into(),
        msg: e.to_string(),
    };
    let file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    let reader = SerializedFileReader::new(file).map_err(perr)?;
    let mut out = Vec::new();
    for row in reader.get_row_iter(None).map_err(perr)? {
        if limit.is_some_and(|l| out.len() >= l) {
            break;
        }
        out.push(row.map_err(perr)?.to_json_value());
    }
    Ok(out)
}

/// Finds the record files of `task` under `data_dir` (see the module doc for the layout).
pub fn task_files(data_dir: &Path, task: Task) -> Result<Vec<PathBuf>> {
    for ext in ["jsonl", "json", "parquet"] {
        let p = data_dir.join(format!("{}.{ext}", task.name()));
        if p.is_file() {
            return Ok(vec![p]);
        }
    }
    let dir = data_dir.join(task.name());
    let mut files = Vec::new();
    if dir.is_dir() {
        collect(&dir, &mut files)?;
    }
    let split = task.split();
    // (configuration, file): the configuration is the relative directory with a `<split>`
    // component removed (`plain_text/validation/0000.parquet` -> `plain_text`).
    let mut picked: Vec<(String, PathBuf)> = files
        .into_iter()
        .filter_map(|p| {
            let rel = p.strip_prefix(&dir).ok()?.to_path_buf();
            let parts: Vec<String> = rel
                .parent()
                .map(|d| d.iter().map(|c| c.to_string_lossy().into_owned()).collect())
                .unwrap_or_default();
            let in_split_dir = parts.iter().any(|c| c == split);
            let named = rel
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.contains(split));
            (in_split_dir || named).then(|| {
                let config: Vec<&str> = parts.iter().map(String::as_str).filter(|c| *c != split).collect();
                (config.join("/"), p)
            })
        })
        .collect();
    picked.sort();
    if picked.is_empty() {
        return Err(Error::Invalid(format!(
            "no data for task {task} in {}: expected {t}.jsonl, {t}.json or {t}.parquet there, or files \
             named *{split}*.jsonl|json|parquet or under a {split}/ directory below {t}/ (see docs/eval.md \
             for how to download them)",
            data_dir.display(),
            t = task.name(),
        )));
    }
    let mut configs: Vec<&String> = picked.iter().map(|(c, _)| c).collect();
    configs.dedup();
    if configs.len() > 1 {
        let want = task
            .configs()
            .iter()
            .find(|w| configs.iter().any(|c| c == *w))
            .ok_or_else(|| {
                Error::Invalid(format!(
                    "task {task}: {} holds {split} files of several configurations {configs:?} and none is \
                     {:?}; keep one of them there",
                    dir.display(),
                    task.configs()
                ))
            })?
            .to_string();
        picked.retain(|(c, _)| *c == want);
    }
    Ok(picked.into_iter().map(|(_, p)| p).collect())
}

fn collect(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    for entry in std::fs::read_dir(dir).map_err(|e| Error::io(dir, e))? {
        let p = entry.map_err(|e| Error::io(dir, e))?.path();
        if p.file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with('.'))
        {
            continue;
        }
        if p.is_dir() {
            collect(&p, out)?;
        } else if matches!(
            p.extension().and_then(|e| e.to_str()),
            Some("jsonl" | "json" | "parquet")
        ) {
            out.push(p);
        }
    }
    Ok(())
}

/// Reads at most `limit` records of `task` from `data_dir`, in file order.
pub fn load_task(data_dir: &Path, task: Task, limit: Option<usize>) -> Result<(Vec<PathBuf>, Vec<Value>)> {
    let files = task_files(data_dir, task)?;
    let mut records = Vec::new();
    for f in &files {
        let left = limit.map(|l| l.saturating_sub(records.len()));
        if left == Some(0) {
            break;
        }
        records.extend(read_records(f, left)?);
    }
    Ok((files, records))
}
