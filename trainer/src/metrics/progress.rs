//! The console progress bar: loss, tokens/s, MFU and memory, updated every step.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use super::StepMetrics;

/// An indicatif bar over the optimizer steps (hidden when stderr is no terminal or disabled).
#[derive(Debug)]
pub struct Progress {
    bar: ProgressBar,
}

impl Progress {
    pub fn new(total: usize, start: usize, enabled: bool) -> Progress {
        let bar = ProgressBar::new(total as u64);
        if !enabled {
            bar.set_draw_target(ProgressDrawTarget::hidden());
        }
        bar.set_style(
            ProgressStyle::with_template("{elapsed_precise} [{bar:30}] {pos}/{len} {msg}")
                .expect("static template")
                .progress_chars("=> "),
        );
        bar.set_position(start as u64);
        Progress { bar }
    }

    pub fn update(&self, m: &StepMetrics) {
        let mfu = m
            .mfu_pct
            .map(|v| format!("{v:.1}%"))
            .unwrap_or_else(|| "n/a".into());
        self.bar.set_position(m.step as u64);
        self.bar.set_message(format!(
            "loss {:.4} | {:.0} tok/s | mfu {} | mem {:.2} GiB{}",
            m.loss,
            m.tps,
            mfu,
            m.memory_gib,
            if m.skipped { " | skipped" } else { "" }
        ));
    }

    /// Replaces the bar's message until the next [`Progress::update`] (e.g. while validating).
    pub fn status(&self, s: impl Into<String>) {
        self.bar.set_message(s.into());
    }

    /// Prints a line above the bar.
    pub fn println(&self, s: impl AsRef<str>) {
        self.bar.println(s.as_ref());
    }

    pub fn finish(&self) {
        self.bar.finish();
    }
}
