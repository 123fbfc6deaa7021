//! Progress of `flamia eval`'s scoring passes (each task, and each validation pass) on stderr: an
//! indicatif bar when stderr is a terminal; otherwise (a log file, a batch job) a line when the
//! pass starts, one at most every [`LINE_EVERY`] while it runs, and one when it ends.
//!
//! [`Counted`] wraps a [`Scorer`] or a [`LanguageModel`] and advances a [`Progress`] by the
//! requests (tasks) or windows (validation) each call scored.

use flamia_eval::{AttnMode, LanguageModel, LogLik, Request, Scorer, TokenScore};
use indicatif::{ProgressBar, ProgressStyle};
use std::io::IsTerminal;
use std::time::{Duration, Instant};

/// Interval between progress lines when stderr is not a terminal.
pub const LINE_EVERY: Duration = Duration::from_secs(30);

/// Progress of one pass over `total` units.
pub struct Progress {
    what: String,
    unit: &'static str,
    total: u64,
    done: u64,
    start: Instant,
    last_line: Instant,
    bar: Option<ProgressBar>,
}

impl Progress {
    /// Starts a pass called `what` over `total` `unit`s.
    pub fn new(what: impl Into<String>, total: u64, unit: &'static str) -> Progress {
        let what = what.into();
        let bar = std::io::stderr().is_terminal().then(|| {
            let bar = ProgressBar::new(total);
            bar.set_style(
                ProgressStyle::with_template("{elapsed_precise} [{bar:30}] {pos}/{len} {msg}")
                    .expect("static template")
                    .progress_chars("=> "),
            );
            bar.set_message(format!("{unit}: {what}"));
            bar
        });
        let now = Instant::now();
        let p = Progress {
            what,
            unit,
            total,
            done: 0,
            start: now,
            last_line: now,
            bar,
        };
        if p.bar.is_none() {
            p.line();
        }
        p
    }

    fn line(&self) {
        let pct = if self.total == 0 {
            100.0
        } else {
            100.0 * self.done as f64 / self.total as f64
        };
        eprintln!(
            "{}: {}/{} {} ({pct:.0}%), {:.1} s",
            self.what,
            self.done,
            self.total,
            self.unit,
            self.start.elapsed().as_secs_f64()
        );
    }

    /// Counts `n` more units done.
    pub fn add(&mut self, n: u64) {
        self.done += n;
        match &self.bar {
            Some(bar) => bar.set_position(self.done),
            None if self.last_line.elapsed() >= LINE_EVERY => {
                self.last_line = Instant::now();
                self.line();
            }
            None => {}
        }
    }

    /// Ends the pass (clears the bar, or prints the last line).
    pub fn finish(self) {
        match &self.bar {
            Some(bar) => bar.finish_and_clear(),
            None => self.line(),
        }
    }
}

/// A scorer or model that advances a [`Progress`] as it scores.
pub struct Counted<'p, T> {
    pub inner: T,
    pub progress: &'p mut Progress,
}

impl<T: Scorer> Scorer for Counted<'_, T> {
    fn loglikelihood(&mut self, requests: &[Request]) -> flamia_eval::Result<Vec<LogLik>> {
        let r = self.inner.loglikelihood(requests)?;
        self.progress.add(requests.len() as u64);
        Ok(r)
    }
}

impl<M: LanguageModel + ?Sized> LanguageModel for Counted<'_, &mut M> {
    fn max_len(&self) -> usize {
        self.inner.max_len()
    }

    fn encode(&self, text: &str) -> flamia_eval::Result<Vec<u32>> {
        self.inner.encode(text)
    }

    fn prefix_token(&self) -> u32 {
        self.inner.prefix_token()
    }

    fn score_tokens(
        &mut self,
        batch: &[Vec<u32>],
        attn: AttnMode,
    ) -> flamia_eval::Result<Vec<Vec<TokenScore>>> {
        let r = self.inner.score_tokens(batch, attn)?;
        self.progress.add(batch.len() as u64);
        Ok(r)
    }

    fn score_tails(
        &mut self,
        batch: &[Vec<u32>],
        tails: &[usize],
        attn: AttnMode,
    ) -> flamia_eval::Result<Vec<Vec<TokenScore>>> {
        let r = self.inner.score_tails(batch, tails, attn)?;
        self.progress.add(batch.len() as u64);
        Ok(r)
    }
}
