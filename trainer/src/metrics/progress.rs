//! The console progress bar: loss, tokens/s, MFU and memory, updated every step. Log lines
//! (`tracing`, written through [`LogWriter`]) are printed with the bar suspended, so the two never
//! mix on the terminal.

use std::io::Write;
use std::sync::Mutex;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// The bar on the terminal now, if any (log lines suspend it while they are written).
static SHOWN: Mutex<Option<ProgressBar>> = Mutex::new(None);

/// `f` with the bar on the terminal (if any) cleared meanwhile and redrawn after.
fn suspended<R>(f: impl FnOnce() -> R) -> R {
    let bar = SHOWN.lock().unwrap_or_else(|p| p.into_inner()).clone();
    match bar {
        Some(b) => b.suspend(f),
        None => f(),
    }
}

/// stderr for the log: each write with the progress bar suspended (`tracing_subscriber`'s
/// `with_writer(|| LogWriter)`).
#[derive(Debug, Default, Clone, Copy)]
pub struct LogWriter;

impl Write for LogWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        suspended(|| std::io::stderr().write_all(buf)).map(|()| buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}

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
        if enabled {
            *SHOWN.lock().unwrap_or_else(|p| p.into_inner()) = Some(bar.clone());
        }
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

    pub fn finish(&self) {
        self.bar.finish();
        SHOWN.lock().unwrap_or_else(|p| p.into_inner()).take();
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        SHOWN.lock().unwrap_or_else(|p| p.into_inner()).take();
    }
}
