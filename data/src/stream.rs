//! The deterministic token stream of one rank: plan (shards -> units) -> per-epoch unit order and
//! rank share -> shuffle blocks of documents -> parallel tokenisation (+ end-of-text, length cap)
//! -> packed rows of `seq_len` inputs and `seq_len` targets with per-row `cu_seqlens`.
//!
//! Everything random is a pure function of `(seed, epoch, block)`, so the position of the next row
//! — `(epoch, block, block start cursor, document in block, token in document)` — is the whole
//! resumable state: resuming re-reads one block (at most `shuffle_buffer` documents).

use std::collections::VecDeque;
use std::sync::Arc;

use rand::seq::SliceRandom;
use rand::SeedableRng;
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use crate::config::Config;
use crate::error::{DataError, Result};
use crate::source::{self, Filters, RawDoc, Shard};
use crate::tokenizer::{fnv1a, Tokenizer};

/// Target id of positions whose next token belongs to another document (the end-of-text position);
/// the loss must ignore them (`cross_entropy(..., ignore_index = -100)`).
pub const IGNORE_INDEX: i64 = -100;

/// Version of [`DataState`]'s layout.
pub const STATE_VERSION: u32 = 1;

/// The shards of a split and their units (row groups / token chunks), in a stable order.
#[derive(Debug)]
pub struct Plan {
    /// Usable shards.
    pub shards: Vec<Shard>,
    /// (shard index, unit index in shard, rows) of every unit.
    pub units: Vec<(usize, usize, usize)>,
    /// Hash of shard names and unit sizes: a state only resumes on the same plan.
    pub fingerprint: u64,
}

impl Plan {
    /// Resolves `specs` and reads every footer.
    pub fn build(specs: &[String], filters: &Filters, skip_bad: bool) -> Result<Plan> {
        let shards = source::open_all(source::resolve(specs, skip_bad)?, filters, skip_bad)?;
        if shards.is_empty() {
            return Err(DataError::NoData(format!("no readable shard in {specs:?}")));
        }
        let mut units = Vec::new();
        let mut fp = String::new();
        for (s, shard) in shards.iter().enumerate() {
            fp.push_str(&format!(
                "{}:{:?};",
                shard.source.path().display(),
                shard.unit_rows
            ));
            units.extend(shard.unit_rows.iter().enumerate().map(|(u, &r)| (s, u, r)));
        }
        Ok(Plan {
            shards,
            units,
            fingerprint: fnv1a(fp.as_bytes()),
        })
    }
}

/// Position in a rank's unit list for one epoch: unit position and raw row within it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cursor {
    /// Index into the rank's unit order of this epoch.
    pub unit: usize,
    /// Stored row within that unit (filtered rows count too).
    pub row: usize,
}

/// Where a rank's stream stands: store it with checkpoints, pass it back to resume exactly.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DataState {
    /// Layout version ([`STATE_VERSION`]).
    pub version: u32,
    /// Hash of the shards, tokenizer, seed and stream settings that must not change on resume.
    pub fingerprint: String,
    /// Rank this state belongs to.
    pub rank: usize,
    /// Data-parallel world size it was made with.
    pub world_size: usize,
    /// Epoch of the next token.
    pub epoch: u64,
    /// Shuffle block (within the epoch) of the next token.
    pub block: u64,
    /// Source cursor where that block starts.
    pub block_start: Cursor,
    /// Document of the block (in shuffled order) holding the next token.
    pub doc: usize,
    /// Token within that document.
    pub token: usize,
    /// Rows this rank has produced so far (informational).
    pub rows: u64,
}

/// A packed row: `seq_len` inputs, their targets, and document boundaries.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    /// Input ids.
    pub tokens: Vec<u32>,
    /// Next-token targets, [`IGNORE_INDEX`] after an end-of-text.
    pub targets: Vec<i64>,
    /// Document boundaries within the row: starts at 0, ends at `seq_len`.
    pub cu_seqlens: Vec<u32>,
}

struct PDoc {
    tokens: Vec<u32>,
    epoch: u64,
    block: u64,
    start: Cursor,
    index: usize,
}

/// Settings of a stream that are fixed for its life.
#[derive(Debug, Clone)]
pub struct StreamSpec {
    /// Row length.
    pub seq_len: usize,
    /// Documents per shuffle block.
    pub shuffle_buffer: usize,
    /// Shuffle unit order and documents.
    pub shuffle: bool,
    /// Seed.
    pub seed: u64,
    /// Stop after one epoch (validation).
    pub one_pass: bool,
    /// Row filters.
    pub filters: Filters,
    /// Document cap including end-of-text.
    pub max_doc_tokens: Option<usize>,
    /// Log and skip unreadable units.
    pub skip_bad: bool,
    /// Tokenizer threads.
    pub threads: usize,
}

impl StreamSpec {
    /// Training (`one_pass = false`) or validation (unshuffled, one pass) settings from a config.
    pub fn from_config(c: &Config, validation: bool) -> StreamSpec {
        StreamSpec {
            seq_len: c.seq_len,
            shuffle_buffer: c.shuffle_buffer,
            shuffle: c.shuffle && !validation,
            seed: c.seed,
            one_pass: validation,
            filters: Filters {
                min_int_score: c.min_int_score,
                language: c.language.clone(),
            },
            max_doc_tokens: c.max_doc_tokens,
            skip_bad: c.skip_bad_shards,
            threads: c.threads(),
        }
    }
}

/// One rank's stream of packed rows.
pub struct Stream {
    plan: Arc<Plan>,
    spec: StreamSpec,
    tok: Arc<Tokenizer>,
    pool: rayon::ThreadPool,
    rank: usize,
    world: usize,
    fingerprint: String,
    epoch: u64,
    order: Vec<usize>,
    prefix: Vec<u64>,
    striding: bool,
    cursor: Cursor,
    cache: Option<(usize, Vec<Option<RawDoc>>)>,
    next_block: u64,
    epoch_docs: u64,
    docs: VecDeque<PDoc>,
    offset: usize,
    avail: usize,
    rows: u64,
}

fn mix(seed: u64, tag: u64, a: u64, b: u64) -> u64 {
    let mut bytes = Vec::with_capacity(32);
    for v in [seed, tag, a, b] {
        bytes.extend_from_slice(&v.to_le_bytes());
    }
    fnv1a(&bytes)
}

impl Stream {
    /// A stream for `rank` of `world` at the start of epoch 0.
    pub fn new(
        plan: Arc<Plan>,
        spec: StreamSpec,
        tok: Arc<Tokenizer>,
        rank: usize,
        world: usize,
    ) -> Result<Self> {
        if world == 0 || rank >= world {
            return Err(DataError::Config(format!(
                "rank {rank} is not in 0..world_size ({world})"
            )));
        }
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(spec.threads.max(1))
            .thread_name(|i| format!("flamia-tok-{i}"))
            .build()
            .map_err(|e| {
                DataError::Config(format!("cannot start {} tokenizer threads: {e}", spec.threads))
            })?;
        let fp = format!(
            "plan={:016x} tok={} buf={} shuffle={} seed={} filters={:?} cap={:?}",
            plan.fingerprint,
            tok.fingerprint(),
            spec.shuffle_buffer,
            spec.shuffle,
            spec.seed,
            spec.filters,
            spec.max_doc_tokens
        );
        let fingerprint = format!("{:016x}", fnv1a(fp.as_bytes()));
        let mut s = Stream {
            plan,
            spec,
            tok,
            pool,
            rank,
            world,
            fingerprint,
            epoch: 0,
            order: Vec::new(),
            prefix: Vec::new(),
            striding: false,
            cursor: Cursor::default(),
            cache: None,
            next_block: 0,
            epoch_docs: 0,
            docs: VecDeque::new(),
            offset: 0,
            avail: 0,
            rows: 0,
        };
        s.start_epoch(0);
        Ok(s)
    }

    /// Positions the stream exactly at `state` (same plan, tokenizer and settings required).
    pub fn resume(&mut self, st: &DataState) -> Result<()> {
        let bad = |m: String| Err(DataError::State(m));
        if st.version != STATE_VERSION {
            return bad(format!(
                "state version {} but this build reads {STATE_VERSION}",
                st.version
            ));
        }
        if st.fingerprint != self.fingerprint {
            return bad(format!(
                "fingerprint {} != {}: shards, tokenizer, seed, shuffle, shuffle_buffer, filters and max_doc_tokens must be unchanged",
                st.fingerprint, self.fingerprint
            ));
        }
        if (st.rank, st.world_size) != (self.rank, self.world) {
            return bad(format!(
                "state is for rank {} of {} but this loader is rank {} of {}",
                st.rank, st.world_size, self.rank, self.world
            ));
        }
        self.start_epoch(st.epoch);
        self.cursor = st.block_start;
        self.next_block = st.block;
        self.epoch_docs = u64::from(st.block_start != Cursor::default());
        self.docs.clear();
        self.avail = 0;
        self.offset = 0;
        if !self.pull_block()? {
            return bad("the state points past the end of the data".into());
        }
        if st.doc >= self.docs.len() || st.token >= self.docs[st.doc].tokens.len() {
            return bad(format!(
                "document {} token {} is outside block {}",
                st.doc, st.token, st.block
            ));
        }
        for _ in 0..st.doc {
            let d = self.docs.pop_front().map(|d| d.tokens.len()).unwrap_or(0);
            self.avail -= d;
        }
        self.offset = st.token;
        self.avail -= st.token;
        self.rows = st.rows;
        Ok(())
    }

    /// The state from which [`Stream::resume`] reproduces the rows still to come.
    pub fn state(&self) -> DataState {
        let (epoch, block, block_start, doc) = match self.docs.front() {
            Some(d) => (d.epoch, d.block, d.start, d.index),
            None => (self.epoch, self.next_block, self.cursor, 0),
        };
        DataState {
            version: STATE_VERSION,
            fingerprint: self.fingerprint.clone(),
            rank: self.rank,
            world_size: self.world,
            epoch,
            block,
            block_start,
            doc,
            token: self.offset,
            rows: self.rows,
        }
    }

    /// The tokenizer in use.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tok
    }

    fn start_epoch(&mut self, epoch: u64) {
        let n = self.plan.units.len();
        let mut order: Vec<usize> = (0..n).collect();
        if self.spec.shuffle {
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(mix(self.spec.seed, 1, epoch, 0));
            order.shuffle(&mut rng);
        }
        // Fewer units than ranks: every rank reads every unit and keeps every world-th row.
        self.striding = n < self.world;
        if self.striding {
            let mut acc = 0u64;
            self.prefix = order
                .iter()
                .map(|&u| {
                    let p = acc;
                    acc += self.plan.units[u].2 as u64;
                    p
                })
                .collect();
            self.order = order;
        } else {
            self.prefix.clear();
            self.order = order
                .into_iter()
                .enumerate()
                .filter(|(i, _)| i % self.world == self.rank)
                .map(|x| x.1)
                .collect();
        }
        self.epoch = epoch;
        self.cursor = Cursor::default();
        self.cache = None;
        self.next_block = 0;
        self.epoch_docs = 0;
    }

    fn next_raw_doc(&mut self) -> Result<Option<RawDoc>> {
        loop {
            let Some(&unit) = self.order.get(self.cursor.unit) else {
                return Ok(None);
            };
            if self.cache.as_ref().is_none_or(|c| c.0 != self.cursor.unit) {
                let (s, u, _) = self.plan.units[unit];
                let rows = match source::read_unit(&self.plan.shards[s], u, &self.spec.filters) {
                    Ok(r) => r,
                    Err(e) if self.spec.skip_bad => {
                        tracing::warn!("skipping unreadable row group {u}: {e}");
                        Vec::new()
                    }
                    Err(e) => return Err(e),
                };
                self.cache = Some((self.cursor.unit, rows));
            }
            let Some((_, rows)) = self.cache.as_mut() else {
                return Ok(None);
            };
            let r = self.cursor.row;
            if r >= rows.len() {
                self.cursor = Cursor {
                    unit: self.cursor.unit + 1,
                    row: 0,
                };
                self.cache = None;
                continue;
            }
            self.cursor.row += 1;
            if self.striding
                && (self.prefix[self.cursor.unit] + r as u64) % self.world as u64 != self.rank as u64
            {
                continue;
            }
            if let Some(d) = rows[r].take() {
                return Ok(Some(d));
            }
        }
    }

    /// Reads, shuffles and tokenises the next block into the queue; false at the end of a
    /// one-pass stream.
    fn pull_block(&mut self) -> Result<bool> {
        loop {
            let (start, epoch, block) = (self.cursor, self.epoch, self.next_block);
            let mut raw = Vec::with_capacity(self.spec.shuffle_buffer);
            while raw.len() < self.spec.shuffle_buffer {
                match self.next_raw_doc()? {
                    Some(d) => raw.push(d),
                    None => break,
                }
            }
            if raw.is_empty() {
                if self.spec.one_pass {
                    return Ok(false);
                }
                if self.epoch_docs == 0 {
                    return Err(DataError::NoData(format!(
                        "rank {} of {} gets no document in epoch {epoch} (filters too strict, or all shards bad?)",
                        self.rank, self.world
                    )));
                }
                self.start_epoch(epoch + 1);
                continue;
            }
            self.epoch_docs += raw.len() as u64;
            self.next_block += 1;
            if self.spec.shuffle {
                let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(mix(self.spec.seed, 2, epoch, block));
                raw.shuffle(&mut rng);
            }
            let (tok, cap) = (&self.tok, self.spec.max_doc_tokens);
            let docs: Vec<Vec<u32>> = self.pool.install(|| {
                raw.into_par_iter()
                    .map(|d| doc_tokens(tok, d, cap))
                    .collect::<Result<_>>()
            })?;
            for (index, tokens) in docs.into_iter().enumerate() {
                self.avail += tokens.len();
                self.docs.push_back(PDoc {
                    tokens,
                    epoch,
                    block,
                    start,
                    index,
                });
            }
            return Ok(true);
        }
    }

    /// The next packed row; `None` once a one-pass stream is used up. The last row of a one-pass
    /// stream is padded with end-of-text inputs whose targets are [`IGNORE_INDEX`] (no token lost).
    pub fn next_row(&mut self) -> Result<Option<Row>> {
        let n = self.spec.seq_len;
        while self.avail < n + 1 {
            if !self.pull_block()? {
                break;
            }
        }
        if self.avail == 0 || (self.avail < n + 1 && !self.spec.one_pass) {
            return Ok(None);
        }
        let mut buf = Vec::with_capacity(n + 1);
        let mut last = Vec::with_capacity(n + 1);
        let mut off = self.offset;
        'fill: for d in &self.docs {
            for (i, &t) in d.tokens.iter().enumerate().skip(off) {
                buf.push(t);
                last.push(i + 1 == d.tokens.len());
                if buf.len() == n + 1 {
                    break 'fill;
                }
            }
            off = 0;
        }
        let real = buf.len();
        let eos = self.tok.eos_id();
        buf.resize(n + 1, eos);
        last.resize(n + 1, true);
        let mut cu = vec![0u32];
        let mut targets = Vec::with_capacity(n);
        for i in 0..n {
            targets.push(if last[i] {
                IGNORE_INDEX
            } else {
                i64::from(buf[i + 1])
            });
            if last[i] && i < real {
                cu.push(i as u32 + 1);
            }
        }
        if cu.last() != Some(&(n as u32)) {
            cu.push(n as u32);
        }
        buf.truncate(n);
        let step = n.min(self.avail);
        self.offset += step;
        self.avail -= step;
        while let Some(f) = self.docs.front() {
            if self.offset < f.tokens.len() {
                break;
            }
            self.offset -= f.tokens.len();
            self.docs.pop_front();
        }
        self.rows += 1;
        Ok(Some(Row {
            tokens: buf,
            targets,
            cu_seqlens: cu,
        }))
    }
}

/// A document's ids: tokenised (or stored), cut to `cap - 1`, then end-of-text.
fn doc_tokens(tok: &Tokenizer, d: RawDoc, cap: Option<usize>) -> Result<Vec<u32>> {
    let mut ids = match d {
        RawDoc::Text(t) => tok.encode(&t)?,
        RawDoc::Tokens(t) => t,
    };
    if let Some(c) = cap {
        ids.truncate(c - 1);
    }
    ids.push(tok.eos_id());
    Ok(ids)
}
