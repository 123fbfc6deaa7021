//! The deterministic token stream of one rank: plan (shards -> units, minus or only the held-out
//! part) -> per-epoch unit order and rank share -> groups of `shuffle_row_groups` row groups whose
//! documents are permuted together -> blocks of `shuffle_buffer` documents tokenised in parallel
//! (`[BOS] + doc + [EOS]`, split into pieces of at most `max_doc_tokens`) -> packed rows of
//! `seq_len` inputs and `seq_len` targets with per-row `cu_seqlens`.
//!
//! Everything random is a pure function of `(seed, epoch, group)`, so the position of the next row
//! — `(epoch, block, block start cursor = (group, position in the group's permuted documents),
//! piece in block, token in piece)` — is the whole resumable state: resuming re-reads one group
//! and re-tokenises one block.

use std::collections::VecDeque;
use std::path::Path;
use std::sync::{Arc, Mutex};

use rand::seq::SliceRandom;
use rand::SeedableRng;
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use crate::config::Config;
use crate::error::{DataError, Result};
use crate::source::{self, DropReason, Drops, Filters, RawDoc, Shard, Slot};
use crate::tokenizer::{fnv1a, Tokenizer};

/// Target id of positions whose next token belongs to another document (the end-of-text position);
/// the loss must ignore them (`cross_entropy(..., ignore_index = -100)`).
pub const IGNORE_INDEX: i64 = -100;

/// Version of [`DataState`]'s layout (2: cursors count documents of a row-group group).
pub const STATE_VERSION: u32 = 2;

/// Which row groups of the training files a validation split holds out.
#[derive(Debug, Clone)]
pub struct Holdout {
    fraction: f64,
    files: Vec<glob::Pattern>,
}

/// The part of a spec list a [`Plan`] covers.
#[derive(Debug, Clone, Copy)]
pub enum Split<'a> {
    /// Every unit.
    All,
    /// Every unit not held out.
    Train(&'a Holdout),
    /// Only the held-out units.
    HeldOut(&'a Holdout),
}

impl Holdout {
    /// The holdout a config asks for, if any.
    pub fn from_config(c: &Config) -> Result<Option<Holdout>> {
        if !c.holds_out() {
            return Ok(None);
        }
        let files = c
            .holdout_files
            .iter()
            .map(|p| {
                glob::Pattern::new(p)
                    .map_err(|e| DataError::Config(format!("`holdout_files` pattern `{p}`: {e}")))
            })
            .collect::<Result<_>>()?;
        Ok(Some(Holdout {
            fraction: c.holdout_fraction,
            files,
        }))
    }

    fn file_held(&self, path: &Path) -> bool {
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        self.files
            .iter()
            .any(|p| p.matches(&name) || p.matches_path(path))
    }

    /// Uniform in [0, 1) from the file name and unit index (splitmix64 finaliser over FNV-1a).
    fn unit_hash(path: &Path, unit: usize) -> f64 {
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let mut z = fnv1a(format!("{name}#{unit}").as_bytes());
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        (z >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Held-out flags of `units` (`(shard path, unit index)`).
    fn held(&self, units: &[(&Path, usize)]) -> Vec<bool> {
        let hashes: Vec<f64> = units.iter().map(|(p, u)| Self::unit_hash(p, *u)).collect();
        let mut held: Vec<bool> = units
            .iter()
            .zip(&hashes)
            .map(|((p, _), &h)| self.file_held(p) || h < self.fraction)
            .collect();
        if self.fraction > 0.0 && !held.iter().any(|&h| h) {
            if let Some(i) = (0..hashes.len()).min_by(|&a, &b| hashes[a].total_cmp(&hashes[b])) {
                held[i] = true;
            }
        }
        held
    }

    fn describe(&self) -> String {
        format!(
            "holdout_fraction {} files {:?}",
            self.fraction,
            self.files.iter().map(|p| p.as_str()).collect::<Vec<_>>()
        )
    }
}

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
        Self::build_split(specs, filters, skip_bad, Split::All)
    }

    /// Reads the footer of every shard of `sources` (resolved from `specs`, which error messages
    /// name) and keeps all their units.
    pub fn from_sources(
        sources: Vec<source::ShardSource>,
        specs: &[String],
        filters: &Filters,
        skip_bad: bool,
    ) -> Result<Plan> {
        Self::from_sources_split(sources, specs, filters, skip_bad, Split::All)
    }

    /// Resolves `specs`, reads every footer and keeps the units of `split`.
    pub fn build_split(
        specs: &[String],
        filters: &Filters,
        skip_bad: bool,
        split: Split<'_>,
    ) -> Result<Plan> {
        Self::from_sources_split(source::resolve(specs, skip_bad)?, specs, filters, skip_bad, split)
    }

    fn from_sources_split(
        sources: Vec<source::ShardSource>,
        specs: &[String],
        filters: &Filters,
        skip_bad: bool,
        split: Split<'_>,
    ) -> Result<Plan> {
        let shards = source::open_all(sources, filters, skip_bad)?;
        if shards.is_empty() {
            return Err(DataError::NoData(format!("no readable shard in {specs:?}")));
        }
        let paths: Vec<_> = shards.iter().map(|s| s.source.path()).collect();
        let all: Vec<(usize, usize, usize)> = shards
            .iter()
            .enumerate()
            .flat_map(|(s, shard)| shard.unit_rows.iter().enumerate().map(move |(u, &r)| (s, u, r)))
            .collect();
        let (units, tag) = match split {
            Split::All => (all, String::new()),
            Split::Train(h) | Split::HeldOut(h) => {
                let keys: Vec<(&Path, usize)> =
                    all.iter().map(|&(s, u, _)| (paths[s].as_path(), u)).collect();
                let held = h.held(&keys);
                let want = matches!(split, Split::HeldOut(_));
                let kept: Vec<_> = all
                    .iter()
                    .zip(&held)
                    .filter(|(_, &x)| x == want)
                    .map(|(u, _)| *u)
                    .collect();
                if kept.is_empty() {
                    return Err(DataError::NoData(format!(
                        "{} of {} row groups of {specs:?} ({}) leaves no {} data",
                        held.iter().filter(|&&x| x).count(),
                        all.len(),
                        h.describe(),
                        if want { "validation" } else { "training" }
                    )));
                }
                (
                    kept,
                    format!("{}:{};", if want { "val" } else { "train" }, h.describe()),
                )
            }
        };
        let mut fp = tag;
        for &(s, u, r) in &units {
            fp.push_str(&format!("{}#{u}:{r};", paths[s].display()));
        }
        Ok(Plan {
            shards,
            units,
            fingerprint: fnv1a(fp.as_bytes()),
        })
    }

    /// The training plan of a config: `train` minus any held-out part.
    pub fn training(c: &Config, filters: &Filters) -> Result<Plan> {
        match Holdout::from_config(c)? {
            Some(h) => Self::build_split(&c.train, filters, c.skip_bad_shards, Split::Train(&h)),
            None => Self::build(&c.train, filters, c.skip_bad_shards),
        }
    }

    /// The validation plan of a config: the held-out part of `train`, else `val`.
    pub fn validation(c: &Config, filters: &Filters) -> Result<Plan> {
        match Holdout::from_config(c)? {
            Some(h) => Self::build_split(&c.train, filters, c.skip_bad_shards, Split::HeldOut(&h)),
            None if c.val.is_empty() => Err(DataError::Config(
                "`val` is empty and nothing of `train` is held out (holdout_fraction / holdout_files): no validation data configured".into(),
            )),
            None => Self::build(&c.val, filters, c.skip_bad_shards),
        }
    }

    /// Every stored document of the plan in unit order (unfiltered rows dropped), at most `limit`.
    pub fn documents(&self, filters: &Filters, limit: Option<usize>) -> Result<Vec<RawDoc>> {
        let mut out = Vec::new();
        for &(s, u, _) in &self.units {
            for d in source::read_unit(&self.shards[s], u, filters)?
                .into_iter()
                .flatten()
            {
                if limit.is_some_and(|l| out.len() >= l) {
                    return Ok(out);
                }
                out.push(d);
            }
        }
        Ok(out)
    }
}

/// Position in a rank's document stream for one epoch: the row-group group and the position in
/// that group's (permuted) document list.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cursor {
    /// Group of `shuffle_row_groups` consecutive units of the rank's unit order this epoch.
    pub unit: usize,
    /// Position in the group's document list (filtered rows count too).
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
    /// Block (within the epoch) of the next token.
    pub block: u64,
    /// Source cursor where that block starts.
    pub block_start: Cursor,
    /// Piece of the block (documents split by `max_doc_tokens`) holding the next token.
    pub doc: usize,
    /// Token within that piece.
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

/// One piece of a document in the packing queue.
struct PDoc {
    tokens: Vec<u32>,
    /// The piece ends the document (its last token is end-of-text, whose target is ignored).
    ends: bool,
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
    /// Documents per block.
    pub shuffle_buffer: usize,
    /// Row groups shuffled together.
    pub shuffle_row_groups: usize,
    /// Shuffle unit order and documents.
    pub shuffle: bool,
    /// Seed.
    pub seed: u64,
    /// Stop after one epoch (validation).
    pub one_pass: bool,
    /// Row filters.
    pub filters: Filters,
    /// Piece length cap including BOS and end-of-text.
    pub max_doc_tokens: Option<usize>,
    /// Log and skip unreadable units and non-UTF-8 rows.
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
            shuffle_row_groups: c.shuffle_row_groups,
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

    /// Units per group: `shuffle_row_groups` when shuffling, else 1 (file order).
    fn group(&self) -> usize {
        if self.shuffle {
            self.shuffle_row_groups.max(1)
        } else {
            1
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
    cache: Option<(usize, Vec<Slot>)>,
    next_block: u64,
    epoch_docs: u64,
    docs: VecDeque<PDoc>,
    offset: usize,
    avail: usize,
    rows: u64,
    drops: Arc<Mutex<Drops>>,
    /// Documents taken this epoch (for the epoch-end log line).
    taken: u64,
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
            "v{STATE_VERSION} plan={:016x} tok={} bos={:?} buf={} groups={} shuffle={} seed={} filters={:?} cap={:?}",
            plan.fingerprint,
            tok.fingerprint(),
            tok.bos_id(),
            spec.shuffle_buffer,
            spec.group(),
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
            drops: Arc::new(Mutex::new(Drops::default())),
            taken: 0,
        };
        s.start_epoch(0);
        Ok(s)
    }

    /// Positions the stream exactly at `state` (same plan, tokenizer and settings required).
    pub fn resume(&mut self, st: &DataState) -> Result<()> {
        let bad = |m: String| Err(DataError::State(m));
        if st.version != STATE_VERSION {
            return bad(format!(
                "state version {} but this build reads {STATE_VERSION} (the document layout changed: BOS, pieces, row-group shuffling); restart the data stream",
                st.version
            ));
        }
        if st.fingerprint != self.fingerprint {
            return bad(format!(
                "fingerprint {} != {}: shards, holdout, tokenizer, seed, shuffle, shuffle_buffer, shuffle_row_groups, filters and max_doc_tokens must be unchanged",
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
                "piece {} token {} is outside block {}",
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

    /// Shared counters of what this stream read but dropped (filters, empty or non-UTF-8 text,
    /// unreadable row groups), counted as the stream passes them.
    pub fn drops(&self) -> Arc<Mutex<Drops>> {
        self.drops.clone()
    }

    fn count_drop(&self, f: impl FnOnce(&mut Drops)) {
        if let Ok(mut d) = self.drops.lock() {
            f(&mut d);
        }
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
        self.taken = 0;
    }

    /// The documents of group `g` (this rank's rows of its units), permuted when shuffling.
    /// `count_bad` counts unreadable units (once, not again on resume mid-group).
    fn read_group(&self, g: usize, count_bad: bool) -> Result<Vec<Slot>> {
        let k = self.spec.group();
        let positions = g * k..((g + 1) * k).min(self.order.len());
        let mut slots = Vec::new();
        for pos in positions {
            let (s, u, rows) = self.plan.units[self.order[pos]];
            let got =
                match source::read_slots(&self.plan.shards[s], u, &self.spec.filters, self.spec.skip_bad) {
                    Ok(r) => r,
                    Err(e) if self.spec.skip_bad => {
                        tracing::warn!("skipping unreadable row group {u}: {e}");
                        if count_bad {
                            self.count_drop(|d| {
                                d.bad_units += 1;
                                d.bad_unit_rows += rows as u64;
                            });
                        }
                        Vec::new()
                    }
                    Err(e) => return Err(e),
                };
            for (r, slot) in got.into_iter().enumerate() {
                if self.striding && (self.prefix[pos] + r as u64) % self.world as u64 != self.rank as u64 {
                    continue;
                }
                slots.push(slot);
            }
        }
        if self.spec.shuffle {
            let mut rng =
                rand_chacha::ChaCha8Rng::seed_from_u64(mix(self.spec.seed, 3, self.epoch, g as u64));
            slots.shuffle(&mut rng);
        }
        Ok(slots)
    }

    fn groups(&self) -> usize {
        self.order.len().div_ceil(self.spec.group())
    }

    fn next_raw_doc(&mut self) -> Result<Option<RawDoc>> {
        loop {
            let g = self.cursor.unit;
            if g >= self.groups() {
                return Ok(None);
            }
            if self.cache.as_ref().is_none_or(|c| c.0 != g) {
                let slots = self.read_group(g, self.cursor.row == 0)?;
                self.cache = Some((g, slots));
            }
            let Some((_, slots)) = self.cache.as_mut() else {
                return Ok(None);
            };
            let r = self.cursor.row;
            if r >= slots.len() {
                self.cursor = Cursor { unit: g + 1, row: 0 };
                self.cache = None;
                continue;
            }
            self.cursor.row += 1;
            match std::mem::replace(&mut slots[r], Err(DropReason::Empty)) {
                Ok(d) => return Ok(Some(d)),
                Err(reason) => self.count_drop(|d| d.add(reason)),
            }
        }
    }

    fn log_epoch_end(&self, epoch: u64) {
        let d = self.drops.lock().map(|d| *d).unwrap_or_default();
        if d.rows() > 0 || d.bad_units > 0 {
            tracing::info!(
                "data rank {} epoch {epoch}: {} documents read; so far {d}",
                self.rank,
                self.taken
            );
        } else {
            tracing::debug!(
                "data rank {} epoch {epoch}: {} documents read, none dropped",
                self.rank,
                self.taken
            );
        }
    }

    /// Reads and tokenises the next block into the queue; false at the end of a one-pass stream.
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
                self.log_epoch_end(epoch);
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
            self.taken += raw.len() as u64;
            self.next_block += 1;
            let (tok, cap) = (&self.tok, self.spec.max_doc_tokens);
            let docs: Vec<Vec<u32>> = self.pool.install(|| {
                raw.into_par_iter()
                    .map(|d| doc_tokens(tok, d))
                    .collect::<Result<_>>()
            })?;
            let mut index = 0;
            for tokens in docs {
                for (piece, ends) in pieces(tokens, cap) {
                    self.avail += piece.len();
                    self.docs.push_back(PDoc {
                        tokens: piece,
                        ends,
                        epoch,
                        block,
                        start,
                        index,
                    });
                    index += 1;
                }
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
        // Per position: the piece ends here (a boundary), and the document ends here (end-of-text:
        // the target is ignored).
        let mut edge = Vec::with_capacity(n + 1);
        let mut off = self.offset;
        'fill: for d in &self.docs {
            for (i, &t) in d.tokens.iter().enumerate().skip(off) {
                let last = i + 1 == d.tokens.len();
                buf.push(t);
                edge.push((last, last && d.ends));
                if buf.len() == n + 1 {
                    break 'fill;
                }
            }
            off = 0;
        }
        let real = buf.len();
        let eos = self.tok.eos_id();
        buf.resize(n + 1, eos);
        edge.resize(n + 1, (true, true));
        let mut cu = vec![0u32];
        let mut targets = Vec::with_capacity(n);
        for i in 0..n {
            let (boundary, doc_end) = edge[i];
            targets.push(if doc_end {
                IGNORE_INDEX
            } else {
                i64::from(buf[i + 1])
            });
            if boundary && i < real {
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

/// A document's ids: `[BOS]` (when the tokenizer has one) + the tokenised (or stored) text +
/// end-of-text.
pub fn doc_tokens(tok: &Tokenizer, d: RawDoc) -> Result<Vec<u32>> {
    let body = match d {
        RawDoc::Text(t) => tok.encode(&t)?,
        RawDoc::Tokens(t) => t,
    };
    let mut ids = Vec::with_capacity(body.len() + 2);
    ids.extend(tok.bos_id());
    ids.extend(body);
    ids.push(tok.eos_id());
    Ok(ids)
}

/// Splits a document's ids into consecutive pieces of at most `cap` tokens (one piece when `cap`
/// is `None` or the document fits); the flag marks the last piece. Every token is kept.
pub fn pieces(ids: Vec<u32>, cap: Option<usize>) -> Vec<(Vec<u32>, bool)> {
    match cap {
        Some(c) if ids.len() > c => {
            let n = ids.len().div_ceil(c);
            ids.chunks(c)
                .enumerate()
                .map(|(i, p)| (p.to_vec(), i + 1 == n))
                .collect()
        }
        _ => vec![(ids, true)],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_keep_every_token() {
        let ids: Vec<u32> = (0..11).collect();
        let p = pieces(ids.clone(), Some(4));
        assert_eq!(p.iter().map(|x| x.0.len()).collect::<Vec<_>>(), [4, 4, 3]);
        assert_eq!(p.iter().map(|x| x.1).collect::<Vec<_>>(), [false, false, true]);
        assert_eq!(p.into_iter().flat_map(|x| x.0).collect::<Vec<_>>(), ids);
        assert_eq!(pieces(ids.clone(), None), vec![(ids.clone(), true)]);
        assert_eq!(pieces(ids.clone(), Some(11)), vec![(ids, true)]);
    }

    #[test]
    fn holdout_is_per_unit_and_independent_of_other_files() {
        let h = Holdout {
            fraction: 0.25,
            files: vec![glob::Pattern::new("*-val.parquet").unwrap()],
        };
        let a = Path::new("/d/a.parquet");
        let units: Vec<(&Path, usize)> = (0..400).map(|u| (a, u)).collect();
        let held = h.held(&units);
        let n = held.iter().filter(|&&x| x).count();
        assert!((60..140).contains(&n), "{n} of 400 held out at 0.25");
        // The same units alongside another file keep their decisions.
        let mut more = units.clone();
        more.push((Path::new("/d/x-val.parquet"), 0));
        let held2 = h.held(&more);
        assert_eq!(&held2[..400], &held[..]);
        assert!(held2[400], "a file matching holdout_files is held out");
        // A tiny positive fraction still holds out one unit.
        let tiny = Holdout {
            fraction: 1e-9,
            files: vec![],
        };
        assert_eq!(tiny.held(&units[..3]).iter().filter(|&&x| x).count(), 1);
    }
}
