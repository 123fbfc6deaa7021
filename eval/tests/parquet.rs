//! Task records read from parquet (the Hugging Face dataset format), including a nested
//! `choices: struct<text: list<string>, label: list<string>>` column as ARC ships it, give the
//! same docs as the JSONL fixture.

mod common;

use arrow::array::{Array, ArrayRef, ListBuilder, RecordBatch, StringArray, StringBuilder, StructArray};
use arrow::datatypes::{DataType, Field};
use flamia_eval::harness::docs_of;
use flamia_eval::loader::{load_task, read_records};
use flamia_eval::Task;
use std::sync::Arc;

fn string_lists(rows: &[Vec<&str>]) -> ArrayRef {
    let mut b = ListBuilder::new(StringBuilder::new());
    for row in rows {
        for s in row {
            b.values().append_value(s);
        }
        b.append(true);
    }
    Arc::new(b.finish())
}

#[test]
fn arc_parquet_matches_jsonl() {
    let (_, json) = load_task(&common::task_fixtures(), Task::ArcEasy, None).unwrap();
    let texts: Vec<Vec<&str>> = json
        .iter()
        .map(|r| {
            r["choices"]["text"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_str().unwrap())
                .collect()
        })
        .collect();
    let labels: Vec<Vec<&str>> = json
        .iter()
        .map(|r| {
            r["choices"]["label"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_str().unwrap())
                .collect()
        })
        .collect();
    let col = |k: &str| -> ArrayRef {
        Arc::new(StringArray::from(
            json.iter()
                .map(|r| r[k].as_str().unwrap().to_string())
                .collect::<Vec<_>>(),
        ))
    };
    let text_arr = string_lists(&texts);
    let label_arr = string_lists(&labels);
    let choices = StructArray::from(vec![
        (
            Arc::new(Field::new("text", text_arr.data_type().clone(), true)),
            text_arr,
        ),
        (
            Arc::new(Field::new("label", label_arr.data_type().clone(), true)),
            label_arr,
        ),
    ]);
    assert!(matches!(choices.data_type(), DataType::Struct(_)));
    let batch = RecordBatch::try_from_iter(vec![
        ("id", col("id")),
        ("question", col("question")),
        ("choices", Arc::new(choices) as ArrayRef),
        ("answerKey", col("answerKey")),
    ])
    .unwrap();

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("arc_easy.parquet");
    let file = std::fs::File::create(&path).unwrap();
    let mut w = parquet::arrow::ArrowWriter::try_new(file, batch.schema(), None).unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();

    let (files, recs) = load_task(dir.path(), Task::ArcEasy, None).unwrap();
    assert_eq!(files, vec![path.clone()]);
    assert_eq!(
        docs_of(Task::ArcEasy, &recs).unwrap(),
        docs_of(Task::ArcEasy, &json).unwrap()
    );
    assert_eq!(read_records(&path, Some(2)).unwrap().len(), 2);
}
