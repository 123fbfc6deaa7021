//! Per-dataset prompt formats, following lm-evaluation-harness's zero-shot task configs
//! (`doc_to_text`, `doc_to_choice`, `doc_to_target`, `target_delimiter: " "`). MMLU and
//! CommonsenseQA use the cloze form (score the answer text, not a letter).

use super::fields::{get, index, int, key_index, string, strings, FieldResult};
use super::Doc;
use crate::scorer::Request;
use serde_json::Value;

/// HellaSwag (`activity_label`, `ctx_a`, `ctx_b` or `ctx`, `endings`, `label`):
/// query = preprocess(activity_label + ": " + ctx_a + " " + capitalize(ctx_b)).
pub(super) fn hellaswag(rec: &Value) -> FieldResult<Doc> {
    let ctx = match (string(rec, "ctx_a"), string(rec, "ctx_b")) {
        (Ok(a), Ok(b)) => format!("{a} {}", py_capitalize(&b)),
        _ => string(rec, "ctx")?,
    };
    let label = string(rec, "activity_label")?;
    let query = hellaswag_preprocess(&format!("{label}: {ctx}"));
    let endings: Vec<String> = strings(rec, "endings")?
        .iter()
        .map(|e| hellaswag_preprocess(e))
        .collect();
    let gold = index(int(rec, "label")?, endings.len(), "label")?;
    Ok(Doc::shared_context(query, &endings, gold))
}

/// ARC-Easy / ARC-Challenge (`question`, `choices.text`, `choices.label`, `answerKey`).
pub(super) fn arc(rec: &Value) -> FieldResult<Doc> {
    let q = string(rec, "question")?;
    let texts = strings(rec, "choices.text")?;
    let gold = key_index(&strings(rec, "choices.label")?, &string(rec, "answerKey")?)?;
    Ok(Doc::shared_context(
        format!("Question: {q}\nAnswer:"),
        &texts,
        gold,
    ))
}

/// PIQA (`goal`, `sol1`, `sol2`, `label`).
pub(super) fn piqa(rec: &Value) -> FieldResult<Doc> {
    let goal = string(rec, "goal")?;
    let sols = vec![string(rec, "sol1")?, string(rec, "sol2")?];
    let gold = index(int(rec, "label")?, 2, "label")?;
    Ok(Doc::shared_context(
        format!("Question: {goal}\nAnswer:"),
        &sols,
        gold,
    ))
}

/// Winogrande (`sentence` with one `_`, `option1`, `option2`, `answer` "1"/"2"), partial scoring:
/// context = sentence up to `_` with the option filled in, continuation = " " + the rest (stripped),
/// the same for both options.
pub(super) fn winogrande(rec: &Value) -> FieldResult<Doc> {
    let sentence = string(rec, "sentence")?;
    let blank = sentence
        .find('_')
        .ok_or_else(|| format!("sentence {sentence:?} has no \"_\" blank"))?;
    let suffix = sentence[blank + 1..].trim().to_string();
    if suffix.is_empty() {
        return Err(format!(
            "sentence {sentence:?} has nothing after the blank to score"
        ));
    }
    let options = [string(rec, "option1")?, string(rec, "option2")?];
    let gold = index(int(rec, "answer")? - 1, 2, "answer - 1")?;
    let requests = options
        .iter()
        .map(|o| Request {
            context: format!("{}{o}", &sentence[..blank]),
            continuation: format!(" {suffix}"),
        })
        .collect();
    let n = suffix.chars().count();
    Ok(Doc {
        requests,
        norm_lens: vec![n, n],
        gold,
        description: String::new(),
    })
}

/// OpenBookQA (`question_stem`, `choices.text`, `choices.label`, `answerKey`).
pub(super) fn openbookqa(rec: &Value) -> FieldResult<Doc> {
    let stem = string(rec, "question_stem")?;
    let texts = strings(rec, "choices.text")?;
    let gold = key_index(&strings(rec, "choices.label")?, &string(rec, "answerKey")?)?;
    Ok(Doc::shared_context(stem, &texts, gold))
}

/// Social IQa (`context`, `question`, `answerA`..`answerC`, `label` "1".."3").
pub(super) fn siqa(rec: &Value) -> FieldResult<Doc> {
    let ctx = string(rec, "context")?;
    let q = string(rec, "question")?;
    let answers = vec![
        string(rec, "answerA")?,
        string(rec, "answerB")?,
        string(rec, "answerC")?,
    ];
    let gold = index(int(rec, "label")? - 1, 3, "label - 1")?;
    Ok(Doc::shared_context(format!("Q: {ctx} {q}\nA:"), &answers, gold))
}

/// CommonsenseQA, cloze form (`question`, `choices.text`, `choices.label`, `answerKey`).
pub(super) fn commonsense_qa(rec: &Value) -> FieldResult<Doc> {
    let q = string(rec, "question")?;
    let texts = strings(rec, "choices.text")?;
    let gold = key_index(&strings(rec, "choices.label")?, &string(rec, "answerKey")?)?;
    Ok(Doc::shared_context(
        format!("Question: {}\nAnswer:", q.trim()),
        &texts,
        gold,
    ))
}

/// BoolQ (`passage`, `question`, `label` 0/1 as in SuperGLUE, or `answer` true/false as in
/// google/boolq); choices "no", "yes".
pub(super) fn boolq(rec: &Value) -> FieldResult<Doc> {
    let passage = string(rec, "passage")?;
    let q = string(rec, "question")?;
    let label = if get(rec, "label").is_ok() {
        int(rec, "label")?
    } else {
        int(rec, "answer")?
    };
    let gold = index(label, 2, "label")?;
    let choices = ["no".to_string(), "yes".to_string()];
    Ok(Doc::shared_context(
        format!("{passage}\nQuestion: {q}?\nAnswer:"),
        &choices,
        gold,
    ))
}

/// MMLU, cloze form (`question`, `choices`, `answer` 0..3 or "A".."D", `subject`), with
/// lm-evaluation-harness's description line as the prompt head (kept as [`Doc::description`] too,
/// so a few-shot prompt has it once, not once per example).
pub(super) fn mmlu(rec: &Value) -> FieldResult<Doc> {
    let q = string(rec, "question")?;
    let choices = strings(rec, "choices")?;
    let answer = match get(rec, "answer")? {
        Value::String(s) if s.len() == 1 && s.as_bytes()[0].is_ascii_uppercase() => {
            i64::from(s.as_bytes()[0] - b'A')
        }
        _ => int(rec, "answer")?,
    };
    let gold = index(answer, choices.len(), "answer")?;
    let head = match string(rec, "subject") {
        Ok(s) if !s.is_empty() => {
            format!(
                "The following are questions (with answers) about {}.\n\n",
                s.replace('_', " ")
            )
        }
        _ => String::new(),
    };
    let mut doc = Doc::shared_context(format!("{head}Question: {}\nAnswer:", q.trim()), &choices, gold);
    doc.description = head;
    Ok(doc)
}

/// LAMBADA (`text`), as lm-evaluation-harness's `lambada_openai`: context = the text up to its
/// last space, continuation = `" " + last word`.
pub(super) fn lambada(rec: &Value) -> FieldResult<Doc> {
    let text = string(rec, "text")?;
    let (ctx, word) = text
        .rsplit_once(' ')
        .ok_or_else(|| format!("text {text:?} has no space before a last word"))?;
    if word.is_empty() || ctx.is_empty() {
        return Err(format!("text {text:?} has no last word after a context"));
    }
    Ok(Doc {
        requests: vec![Request {
            context: ctx.to_string(),
            continuation: format!(" {word}"),
        }],
        norm_lens: vec![word.chars().count()],
        gold: 0,
        description: String::new(),
    })
}

/// Python's `str.capitalize()`: first character upper case, the rest lower case.
fn py_capitalize(s: &str) -> String {
    let mut chars = s.chars();
    match chars.next() {
        Some(first) => first
            .to_uppercase()
            .chain(chars.flat_map(char::to_lowercase))
            .collect(),
        None => String::new(),
    }
}

/// lm-evaluation-harness's HellaSwag `preprocess`: strip, `" [title]"` -> `". "`, drop every
/// `[...]` (WikiHow artefacts, non-greedy), then `"  "` -> `" "` once.
fn hellaswag_preprocess(text: &str) -> String {
    let text = text.trim().replace(" [title]", ". ");
    let mut out = String::with_capacity(text.len());
    let mut rest = text.as_str();
    while let Some(open) = rest.find('[') {
        match rest[open..].find(']') {
            Some(close) => {
                out.push_str(&rest[..open]);
                rest = &rest[open + close + 1..];
            }
            None => break,
        }
    }
    out.push_str(rest);
    out.replace("  ", " ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capitalize_matches_python() {
        assert_eq!(py_capitalize("then THE man"), "Then the man");
        assert_eq!(py_capitalize(""), "");
    }

    #[test]
    fn hellaswag_preprocess_matches_python() {
        // Python: preprocess("  How to X [title] Do it [step] now.  ") == "How to X. Do it now."
        assert_eq!(
            hellaswag_preprocess("  How to X [title] Do it [step] now.  "),
            "How to X. Do it now."
        );
        assert_eq!(hellaswag_preprocess("a [b"), "a [b");
    }
}
