//! The loader the trainer consumes: a background thread runs the [`Stream`] and keeps a bounded
//! queue of ready batches (`prefetch` deep); `next_batch` takes one and `state` is the exact resume
//! point after the last batch taken (not after what the thread has prepared ahead).
//!
//! Batch layout: `tokens` and `targets` are row-major `(rows, seq_len)`; row `r` holds stream
//! tokens `[p, p + seq_len)` as inputs and `[p + 1, p + seq_len + 1)` as targets (so consecutive
//! rows overlap by the one token that is the last row's final target), except that the target of
//! every end-of-text position is [`IGNORE_INDEX`](crate::IGNORE_INDEX): with document masking that
//! position cannot see the next document. `cu_seqlens[r]` are row `r`'s document boundaries
//! (`0 .. seq_len`); a document cut at a row edge ends at `seq_len` and continues at 0 of the next
//! row.

use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, Receiver};

use crate::config::Config;
use crate::error::{DataError, Result};
use crate::source::Drops;
use crate::stream::{DataState, Plan, Stream, StreamSpec};
use crate::tokenizer::Tokenizer;

/// A batch of packed rows for one rank.
#[derive(Debug, Clone, PartialEq)]
pub struct Batch {
    /// Rows in this batch (`batch_rows`, fewer only at the end of a validation pass).
    pub rows: usize,
    /// Tokens per row.
    pub seq_len: usize,
    /// Input ids, `(rows, seq_len)` row-major.
    pub tokens: Vec<u32>,
    /// Next-token targets, `(rows, seq_len)`; [`IGNORE_INDEX`](crate::IGNORE_INDEX) (-100) after
    /// an end-of-text.
    pub targets: Vec<i64>,
    /// Per row, document boundaries `0 = c0 < c1 < .. < ck = seq_len`.
    pub cu_seqlens: Vec<Vec<u32>>,
}

impl Batch {
    /// Boundaries of the whole batch as one varlen sequence of `rows * seq_len` tokens (row edges
    /// are boundaries), the form `flamia_kernels::VarlenShape` takes.
    pub fn packed_cu_seqlens(&self) -> Vec<usize> {
        let mut cu = vec![0usize];
        for (r, row) in self.cu_seqlens.iter().enumerate() {
            cu.extend(row.iter().skip(1).map(|&c| r * self.seq_len + c as usize));
        }
        cu
    }

    /// Targets that count in the loss (not [`IGNORE_INDEX`](crate::IGNORE_INDEX)).
    pub fn target_tokens(&self) -> usize {
        self.targets.iter().filter(|&&t| t >= 0).count()
    }
}

/// Counters of a loader's consumer side.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LoaderStats {
    /// Batches handed out.
    pub batches: u64,
    /// Input tokens handed out.
    pub tokens: u64,
    /// Time `next_batch` spent waiting for the background thread.
    pub wait: Duration,
}

type Item = Result<(Batch, DataState)>;

/// Streams batches for one data-parallel rank.
pub struct Loader {
    rx: Option<Receiver<Item>>,
    handle: Option<JoinHandle<()>>,
    state: DataState,
    vocab: usize,
    eos: u32,
    bos: Option<u32>,
    stats: LoaderStats,
    drops: Arc<Mutex<Drops>>,
    done: bool,
    shards: Vec<String>,
}

impl std::fmt::Debug for Loader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Loader")
            .field("state", &self.state)
            .field("stats", &self.stats)
            .finish()
    }
}

impl Loader {
    /// The training loader of `rank` of `world_size`: `cfg.train` minus any held-out part,
    /// shuffled, endless (epochs repeat), resumed from `state` when given. Bad config, shards or
    /// tokenizer are reported here.
    pub fn new(cfg: &Config, rank: usize, world_size: usize, state: Option<DataState>) -> Result<Loader> {
        Self::build(cfg, false, rank, world_size, state)
    }

    /// The validation loader: the held-out part of `cfg.train` (`holdout_fraction` /
    /// `holdout_files`), else `cfg.val`; in order, unshuffled, one pass (then `None`), this rank's
    /// share only. Ranks may get different numbers of batches.
    pub fn validation(cfg: &Config, rank: usize, world_size: usize) -> Result<Loader> {
        Self::build(cfg, true, rank, world_size, None)
    }

    fn build(
        cfg: &Config,
        validation: bool,
        rank: usize,
        world: usize,
        state: Option<DataState>,
    ) -> Result<Loader> {
        cfg.validate()?;
        let tok = Arc::new(Tokenizer::from_spec(&cfg.tokenizer)?);
        let spec = StreamSpec::from_config(cfg, validation);
        let plan = Arc::new(if validation {
            Plan::validation(cfg, &spec.filters)?
        } else {
            Plan::training(cfg, &spec.filters)?
        });
        let shards = plan
            .shards
            .iter()
            .map(|s| format!("{} ({} units)", s.source.path().display(), s.unit_rows.len()))
            .collect();
        let fp = tok.fingerprint();
        for s in plan.shards.iter() {
            if let Some(f) = s.token_fingerprint.as_ref().filter(|f| **f != fp) {
                let hint = crate::tokshard::old_fingerprint_hint(f);
                return Err(DataError::TokShard {
                    path: s.source.path(),
                    problem: format!(
                        "made with tokenizer {f} but the config uses {fp} ({}){hint}",
                        cfg.tokenizer
                    ),
                });
            }
        }
        let mut stream = Stream::new(plan, spec, tok.clone(), rank, world)?;
        if let Some(st) = &state {
            stream.resume(st)?;
        }
        let state = stream.state();
        let drops = stream.drops();
        let rows = cfg.batch_rows;
        let mut loader = Loader {
            rx: None,
            handle: None,
            state,
            vocab: tok.vocab_size(),
            eos: tok.eos_id(),
            bos: tok.bos_id(),
            stats: LoaderStats::default(),
            drops,
            done: false,
            shards,
        };
        loader.start(cfg.prefetch, format!("flamia-data-{rank}"), move || {
            next_batch(&mut stream, rows)
        })?;
        Ok(loader)
    }

    /// Starts the background thread: it calls `produce` and queues (at most `depth`) batches until
    /// `produce` returns `None` or an error (queued too), or the loader is dropped.
    fn start<F>(&mut self, depth: usize, name: String, mut produce: F) -> Result<()>
    where
        F: FnMut() -> Result<Option<(Batch, DataState)>> + Send + 'static,
    {
        let (tx, rx) = bounded::<Item>(depth);
        let handle = std::thread::Builder::new()
            .name(name)
            .spawn(move || loop {
                let item = produce();
                let stop = !matches!(item, Ok(Some(_)));
                let msg = match item {
                    Ok(Some(b)) => Ok(b),
                    Ok(None) => break,
                    Err(e) => Err(e),
                };
                if tx.send(msg).is_err() || stop {
                    break;
                }
            })
            .map_err(|e| DataError::Prefetch(format!("cannot spawn: {e}")))?;
        self.rx = Some(rx);
        self.handle = Some(handle);
        Ok(())
    }

    /// Why the background thread closed its queue: `None` after a normal end of data, the panic
    /// message if it panicked (a panic must not look like the end of a validation pass).
    fn thread_failure(&mut self) -> Option<DataError> {
        let payload = self.handle.take()?.join().err()?;
        let msg = payload
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a panic without a message".into());
        Some(DataError::Prefetch(format!(
            "it panicked ({msg}) after {} batches; the data stream is incomplete",
            self.stats.batches
        )))
    }

    /// The next batch; `None` only at the end of a validation pass.
    pub fn next_batch(&mut self) -> Result<Option<Batch>> {
        if self.done {
            return Ok(None);
        }
        let Some(rx) = self.rx.as_ref() else {
            return Ok(None);
        };
        let t0 = Instant::now();
        let got = rx.recv();
        self.stats.wait += t0.elapsed();
        match got {
            Ok(Ok((b, st))) => {
                self.state = st;
                self.stats.batches += 1;
                self.stats.tokens += b.tokens.len() as u64;
                Ok(Some(b))
            }
            Ok(Err(e)) => {
                self.done = true;
                Err(e)
            }
            Err(_) => {
                // The thread dropped its sender: either the data ended or it panicked.
                self.done = true;
                match self.thread_failure() {
                    Some(e) => Err(e),
                    None => Ok(None),
                }
            }
        }
    }

    /// Exact resume point after the last batch returned by [`Loader::next_batch`].
    pub fn state(&self) -> DataState {
        self.state.clone()
    }

    /// The shards this loader's split was built from, in plan order, each as `path (N units)`
    /// (ranks compare these at start-up: a shard one rank could not read changes its list).
    pub fn shards(&self) -> &[String] {
        &self.shards
    }

    /// Ids the model must embed.
    pub fn vocab_size(&self) -> usize {
        self.vocab
    }

    /// The end-of-text id that ends every document.
    pub fn eos_id(&self) -> u32 {
        self.eos
    }

    /// The beginning-of-text id that starts every document, if the tokenizer has one.
    pub fn bos_id(&self) -> Option<u32> {
        self.bos
    }

    /// What the stream has read but not trained on so far (filtered, empty or non-UTF-8 rows,
    /// unreadable row groups), counted by the background thread as it passes them (it runs up to
    /// `prefetch` batches ahead of [`Loader::next_batch`]). Also logged at each epoch's end.
    pub fn drops(&self) -> Drops {
        self.drops.lock().map(|d| *d).unwrap_or_default()
    }

    /// Consumer-side counters (batches, tokens, time spent waiting on the background thread).
    pub fn stats(&self) -> LoaderStats {
        self.stats
    }
}

impl Iterator for Loader {
    type Item = Result<Batch>;

    fn next(&mut self) -> Option<Result<Batch>> {
        self.next_batch().transpose()
    }
}

impl Drop for Loader {
    fn drop(&mut self) {
        // Closing the channel makes the thread's next send fail, so it ends after its current batch.
        self.rx.take();
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

/// Collects `rows` rows into a batch with the state after its last row; a short batch at the end
/// of a one-pass stream; `None` when nothing is left.
pub fn next_batch(stream: &mut Stream, rows: usize) -> Result<Option<(Batch, DataState)>> {
    let mut b = Batch {
        rows: 0,
        seq_len: 0,
        tokens: Vec::new(),
        targets: Vec::new(),
        cu_seqlens: Vec::new(),
    };
    while b.rows < rows {
        let Some(r) = stream.next_row()? else { break };
        b.seq_len = r.tokens.len();
        b.tokens.extend_from_slice(&r.tokens);
        b.targets.extend_from_slice(&r.targets);
        b.cu_seqlens.push(r.cu_seqlens);
        b.rows += 1;
    }
    Ok((b.rows > 0).then(|| (b, stream.state())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_in_the_prefetch_thread_is_an_error_not_the_end_of_data() {
        let cfg = Config {
            seq_len: 16,
            batch_rows: 2,
            ..Config::default()
        };
        let mut l = Loader::validation(&cfg, 0, 1).unwrap();
        let first = l.next_batch().unwrap().expect("a first batch");
        // Stop the real thread, then run one that gives one batch and panics on the next.
        l.rx = None;
        l.handle.take().unwrap().join().unwrap();
        let st = l.state();
        let (b, mut n) = (first.clone(), 0);
        l.start(1, "test-prefetch".into(), move || {
            n += 1;
            if n > 1 {
                panic!("injected failure in call {n}");
            }
            Ok(Some((b.clone(), st.clone())))
        })
        .unwrap();
        assert_eq!(l.next_batch().unwrap(), Some(first));
        let e = l.next_batch().expect_err("a panic is not the end of data");
        assert!(matches!(e, DataError::Prefetch(_)), "{e}");
        assert!(e.to_string().contains("injected failure in call 2"), "{e}");
        // A thread that simply runs out of data still ends the stream normally.
        l.done = false;
        l.start(1, "test-prefetch".into(), || Ok(None)).unwrap();
        assert_eq!(l.next_batch().unwrap(), None);
    }
}
