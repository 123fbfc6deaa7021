//! Reading fields out of a JSON record (a JSONL line or a parquet row converted to JSON), with
//! error messages that name the field and what was expected.

use serde_json::Value;

pub(super) type FieldResult<T> = std::result::Result<T, String>;

/// The value at a dotted path (`choices.text`).
pub(super) fn get<'a>(rec: &'a Value, path: &str) -> FieldResult<&'a Value> {
    let mut v = rec;
    for key in path.split('.') {
        v = v.get(key).ok_or_else(|| {
            let have: Vec<&str> = rec
                .as_object()
                .map(|o| o.keys().map(String::as_str).collect())
                .unwrap_or_default();
            format!("missing field {path:?} (record has fields {have:?})")
        })?;
    }
    Ok(v)
}

/// A string field.
pub(super) fn string(rec: &Value, path: &str) -> FieldResult<String> {
    match get(rec, path)? {
        Value::String(s) => Ok(s.clone()),
        other => Err(format!("field {path:?} must be a string, got {other}")),
    }
}

/// A list of strings.
pub(super) fn strings(rec: &Value, path: &str) -> FieldResult<Vec<String>> {
    let v = get(rec, path)?;
    let arr = list(v).ok_or_else(|| format!("field {path:?} must be a list of strings, got {v}"))?;
    arr.iter()
        .map(|x| match x {
            Value::String(s) => Ok(s.clone()),
            other => Err(format!("field {path:?} must hold strings, found {other}")),
        })
        .collect()
}

/// A list; parquet rows of `list<...>` arrive as arrays, and some writers wrap them as
/// `{"list": [{"element": ...}]}` or `{"item": ...}`: both are accepted.
fn list(v: &Value) -> Option<Vec<Value>> {
    match v {
        Value::Array(a) => Some(
            a.iter()
                .map(|x| match x {
                    Value::Object(o)
                        if o.len() == 1 && (o.contains_key("element") || o.contains_key("item")) =>
                    {
                        o.values().next().cloned().unwrap_or(Value::Null)
                    }
                    other => other.clone(),
                })
                .collect(),
        ),
        Value::Object(o) if o.len() == 1 && o.contains_key("list") => o.get("list").and_then(list),
        _ => None,
    }
}

/// An integer label given as a number, a numeric string or a boolean.
pub(super) fn int(rec: &Value, path: &str) -> FieldResult<i64> {
    match get(rec, path)? {
        Value::Number(n) => n
            .as_i64()
            .ok_or_else(|| format!("field {path:?} must be an integer, got {n}")),
        Value::String(s) => s
            .trim()
            .parse()
            .map_err(|_| format!("field {path:?} must be an integer, got string {s:?}")),
        Value::Bool(b) => Ok(i64::from(*b)),
        other => Err(format!("field {path:?} must be an integer, got {other}")),
    }
}

/// Converts a label to an index in `0..n`.
pub(super) fn index(label: i64, n: usize, what: &str) -> FieldResult<usize> {
    usize::try_from(label)
        .ok()
        .filter(|&i| i < n)
        .ok_or_else(|| format!("{what} {label} is out of range for {n} choices"))
}

/// Position of `key` in `labels` (ARC / OpenBookQA / CommonsenseQA `answerKey` in `choices.label`).
pub(super) fn key_index(labels: &[String], key: &str) -> FieldResult<usize> {
    let key = key.trim();
    labels
        .iter()
        .position(|l| l == key)
        .ok_or_else(|| format!("answerKey {key:?} is not one of the labels {labels:?}"))
}
