//! The tasks: names, default splits, and the conversion of one dataset record (its standard
//! Hugging Face field layout, as lm-evaluation-harness's task configs read it) into a [`Doc`]: one
//! log-likelihood request per choice plus the gold index. Multiple-choice tasks score every
//! choice; LAMBADA ([`Kind::LastWord`]) scores the one true last word (greedy accuracy and
//! perplexity).

mod fields;
mod formats;

use crate::error::{Error, Result};
use crate::scorer::Request;
use serde_json::Value;

/// A supported task.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Task {
    Hellaswag,
    ArcEasy,
    ArcChallenge,
    Piqa,
    Winogrande,
    OpenBookQa,
    Siqa,
    CommonsenseQa,
    Boolq,
    Mmlu,
    Lambada,
}

/// How a task is scored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Argmax of the choices' log-likelihoods (`acc`, `acc_norm`).
    MultipleChoice,
    /// One continuation: accuracy = every token is the greedy prediction, and perplexity =
    /// exp(-mean log-likelihood) over examples (lm-evaluation-harness's `lambada_openai`).
    LastWord,
}

impl Task {
    /// Every task, in report order.
    pub const ALL: [Task; 11] = [
        Task::Hellaswag,
        Task::ArcEasy,
        Task::ArcChallenge,
        Task::Piqa,
        Task::Winogrande,
        Task::OpenBookQa,
        Task::Siqa,
        Task::CommonsenseQa,
        Task::Boolq,
        Task::Mmlu,
        Task::Lambada,
    ];

    /// Name on the command line, in file names and in result files.
    pub fn name(self) -> &'static str {
        match self {
            Task::Hellaswag => "hellaswag",
            Task::ArcEasy => "arc_easy",
            Task::ArcChallenge => "arc_challenge",
            Task::Piqa => "piqa",
            Task::Winogrande => "winogrande",
            Task::OpenBookQa => "openbookqa",
            Task::Siqa => "siqa",
            Task::CommonsenseQa => "commonsense_qa",
            Task::Boolq => "boolq",
            Task::Mmlu => "mmlu",
            Task::Lambada => "lambada_openai",
        }
    }

    /// How the task is scored.
    pub fn kind(self) -> Kind {
        match self {
            Task::Lambada => Kind::LastWord,
            _ => Kind::MultipleChoice,
        }
    }

    /// Hugging Face dataset configurations (subset directories) this task reads, preferred first,
    /// when a download holds several (e.g. `ai2_arc`'s `ARC-Easy` and `ARC-Challenge`).
    pub fn configs(self) -> &'static [&'static str] {
        match self {
            Task::ArcEasy => &["ARC-Easy"],
            Task::ArcChallenge => &["ARC-Challenge"],
            Task::Winogrande => &["winogrande_xl"],
            Task::OpenBookQa => &["main"],
            Task::Mmlu => &["all"],
            Task::Piqa | Task::Boolq => &["plain_text", "default"],
            Task::Lambada => &["default", "en"],
            _ => &["default"],
        }
    }

    /// The split lm-evaluation-harness scores (file names containing it are preferred when a
    /// task directory holds several splits).
    pub fn split(self) -> &'static str {
        match self {
            Task::ArcEasy | Task::ArcChallenge | Task::OpenBookQa | Task::Mmlu | Task::Lambada => "test",
            _ => "validation",
        }
    }

    /// Parses a comma-separated list (`all` selects every task).
    pub fn parse_list(s: &str) -> Result<Vec<Task>> {
        let mut out = Vec::new();
        for name in s.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            if name == "all" {
                out.extend(Task::ALL);
                continue;
            }
            out.push(name.parse()?);
        }
        if out.is_empty() {
            return Err(Error::Invalid(format!(
                "no task given; allowed: all, {}",
                Task::names()
            )));
        }
        out.sort();
        out.dedup();
        Ok(out)
    }

    /// Comma-separated list of every task name.
    pub fn names() -> String {
        Task::ALL.iter().map(|t| t.name()).collect::<Vec<_>>().join(", ")
    }

    /// Converts one record of this task's dataset into a [`Doc`].
    pub fn doc(self, record: &Value, index: usize) -> Result<Doc> {
        let doc = match self {
            Task::Hellaswag => formats::hellaswag(record),
            Task::ArcEasy | Task::ArcChallenge => formats::arc(record),
            Task::Piqa => formats::piqa(record),
            Task::Winogrande => formats::winogrande(record),
            Task::OpenBookQa => formats::openbookqa(record),
            Task::Siqa => formats::siqa(record),
            Task::CommonsenseQa => formats::commonsense_qa(record),
            Task::Boolq => formats::boolq(record),
            Task::Mmlu => formats::mmlu(record),
            Task::Lambada => formats::lambada(record),
        };
        let doc = doc.map_err(|msg| Error::Record {
            task: self.name().into(),
            index,
            msg,
        })?;
        if doc.gold >= doc.requests.len() {
            return Err(Error::Record {
                task: self.name().into(),
                index,
                msg: format!("gold index {} but only {} choices", doc.gold, doc.requests.len()),
            });
        }
        Ok(doc)
    }
}

impl std::fmt::Display for Task {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Task {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        Task::ALL
            .into_iter()
            .find(|t| t.name() == s)
            .ok_or_else(|| Error::Invalid(format!("unknown task {s:?}; allowed: all, {}", Task::names())))
    }
}

/// One multiple-choice example, ready to score.
#[derive(Debug, Clone, PartialEq)]
pub struct Doc {
    /// One request per choice. Most tasks share the context and vary the continuation
    /// (`" " + choice`); Winogrande varies the context and scores the shared suffix.
    pub requests: Vec<Request>,
    /// Length in characters (Unicode scalar values, like Python's `len`) of each choice string,
    /// without the leading delimiter: `acc_norm` divides each log-likelihood by it. For
    /// Winogrande it is the shared suffix, so there `acc_norm` equals `acc`.
    pub norm_lens: Vec<usize>,
    /// Index of the correct choice.
    pub gold: usize,
    /// The task description that heads every request's context (lm-evaluation-harness's
    /// `description`, MMLU's "The following are questions (with answers) about {subject}.\n\n";
    /// empty for the other tasks). A few-shot prompt carries it once, in front of the examples
    /// ([`crate::harness::with_fewshot`]).
    pub description: String,
}

impl Doc {
    /// A request's context without the leading [`Doc::description`].
    pub fn question<'a>(&self, r: &'a Request) -> &'a str {
        r.context
            .strip_prefix(self.description.as_str())
            .unwrap_or(&r.context)
    }

    /// The gold request as one text (context without the description + continuation): a solved
    /// example for few-shot prompts.
    pub fn solved(&self) -> String {
        let r = &self.requests[self.gold];
        format!("{}{}", self.question(r), r.continuation)
    }

    /// A doc with one shared context and `" " + choice` continuations.
    pub(crate) fn shared_context(context: String, choices: &[String], gold: usize) -> Doc {
        Doc {
            requests: choices
                .iter()
                .map(|c| Request {
                    context: context.clone(),
                    continuation: format!(" {c}"),
                })
                .collect(),
            norm_lens: choices.iter().map(|c| c.chars().count()).collect(),
            gold,
            description: String::new(),
        }
    }
}
