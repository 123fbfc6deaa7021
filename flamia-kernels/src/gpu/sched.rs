//! Work lists of the persistent kernels (`cuda/sched.cuh`), built once per packing on the host.
//!
//! The v4 forward's unit of work is one 128-token query tile of one document for one query head.
//! Its cost is the number of 128-key tiles it visits (causal: tile i of a document visits i + 1;
//! otherwise every tile of the document). Items are sorted by descending cost, and the heads of
//! one tile are adjacent, so the CTAs in flight at any time stream the same few heads' K/V
//! (shared in L2) while a CTA that runs out of work takes the next longest item from the
//! kernel's atomic counter: the long documents' tiles start first and the short ones fill the
//! tail.
//!
//! Both lists take the query heads in groups ([`HEAD_GROUP`] = 2 heads, whole GQA groups): every
//! item of heads 0-1 longest first, then heads 2-3, and so on. With ~130 CTAs in flight, a tile's
//! 16 heads side by side span every head's K/V (forward) or Q/dO/dQ rows (backward), and read
//! each tile ~2x from DRAM; two heads keep them in L2 (forward -3..-9%, backward -4..-8% at long
//! documents, docs/perf.md "Session 28"). The forward keeps every head at once where its query
//! tiles visit few key tiles ([`FWD_GROUP_MIN_TILES`]: nothing to share, and two heads read 128
//! bytes of each token's 2 KB rows), takes at least [`FWD_GROUP_ROW_BYTES`] of each token's K/V
//! code row (four heads at d = 64), and takes larger groups where two heads would make a long
//! document's items wait for the earlier groups ([`HEAD_GROUP_SLACK`] of a list makespan
//! model); the backward groups only its downward walks, with enough heads that no (document,
//! head) has more than [`BWD_CHAIN_TILES`] key tiles in flight, and only where a larger
//! group's rows would not fit L2 ([`BWD_GROUP_BYTES`]): a smaller group has more of one head's
//! key tiles in flight, a longer pipeline on each query tile's semaphore.
//!
//! The v4 backward's unit of work is one 128-key tile of one document for one query head; its cost
//! is the number of 64-query steps it walks (causal: from the tile to the document end). Items are
//! sorted by descending cost with ties in document and tile order, the query heads of one tile
//! adjacent and ascending: within a document the key tiles are then taken in ascending order, the
//! order in which the kernel's semaphores let each query tile's dQ partials in (an item only ever
//! waits for items taken before it, so the ordered reduction cannot deadlock), and the heads of a
//! GQA group are taken in the order their dK/dV partials are summed.
//!
//! A document of at most [`bwd_up_tiles`] key tiles (causal; `FLAMIA_BWD_UP_TILES`, default
//! [`BWD_UP_TILES`] = 128 tiles, 16,384 tokens) is listed the other way: after every longer document, documents longest first, in a
//! document head by head (ascending: a GQA group's partial-sum order), each head's key tiles
//! highest first. Its tiles walk their query tiles from the diagonal up and each query tile takes
//! their dQ partials highest key tile first (kernel `BWD_WALK_UP`), so the key tiles of one
//! document and head run together, each two steps ahead of the next lower one, and read the same
//! Q/dO tiles and dQ rows from L2, where the downward walk starts them all on the document's last
//! query tile, one after another on its semaphore. Again an item only ever waits for items listed
//! before it. Longest-first is given up inside such a document (its longest tile is listed last),
//! so it suits documents whose longest tile is short against a CTA's share of the launch. It needs
//! the items to *start* in list order too, which the kernel's claim at an item's start does not
//! give (measured 1.8-2.1x slower); the producer's late claim (`BWD_LATE_CLAIM`, the default)
//! does: backward -17..-22% at 16x4096 .. 64x1024, -5% 8x8192, -6..-7% 256x256 and mixed
//! lengths; documents of 16,384 tokens gained ~0.5% more walking up and 65,536 lose 14% (the
//! longest tile listed last is the launch's tail), hence 64 tiles (docs/perf.md "Session 12").
//! Session 32 measured the threshold again on the kernels of today (same call, two rounds):
//! 128 tiles (16,384 tokens) takes 1.5% off the training call at 4x16384 at d = 128, 8% at
//! d = 64 and 5.5% with 4 KV heads, 1-6% on lognormal (one 14,975-token document); 256 lost
//! 1.5% at 2x32768, and 65,536-token documents still lose 7%: hence 128.
//!
//! The backward's FP32 dQ accumulator ([tokens x query heads x 128]) and, for GQA, its dK/dV
//! partial sums grow with the packed row; past [`BWD_SCRATCH_BUDGET`] the query heads are split
//! into chunks of whole KV groups, one launch per chunk (items listed chunk by chunk, each chunk
//! longest first), so the scratch is one chunk's. When every document walks up (causal, at most
//! [`BWD_UP_TILES`] key tiles each) the budget is [`BWD_SCRATCH_BUDGET_UP`]: at a 65,536-token
//! row and 16 heads one launch instead of two, the training call -0.3..-2.9% on the five
//! workloads of such documents, while on longer ones the one launch lost (1x65536 +2%, 4x16384
//! +64%; docs/perf.md "Session 18").

use crate::options::VarlenShape;

/// Query rows of one forward work item (two consumer warpgroups of 64 rows).
pub const FWD_QT: usize = 128;
/// Keys per tile of the v4 forward.
pub const FWD_KT: usize = 128;

/// Key tiles the query tile at `q0` of a `len`-token document visits (causal: up to its last
/// query); the same count as `fwd_key_tiles` in `cuda/attn_fwd_v4.cu`.
fn key_tiles(len: usize, q0: usize, causal: bool) -> usize {
    let kend = if causal { len.min(q0 + FWD_QT) } else { len };
    kend.div_ceil(FWD_KT)
}

/// Work items `tile * heads + head` of `tiles` ordered by descending `cost[tile]`, ties in tile
/// order, the heads of one tile adjacent and ascending; with `group < heads`, group by group of
/// `group` heads (each group longest first), so fewer heads' K/V (forward) or Q/dO/dQ rows
/// (backward) are in flight at once and more of each is read from L2 ([`HEAD_GROUP`]).
fn longest_first(mut tiles: Vec<usize>, cost: &[usize], heads: usize, group: usize) -> Vec<i32> {
    tiles.sort_by_key(|&t| (std::cmp::Reverse(cost[t]), t));
    let (tiles, group) = (&tiles, group.clamp(1, heads.max(1)));
    (0..heads)
        .step_by(group)
        .flat_map(|g0| {
            tiles
                .iter()
                .flat_map(move |&t| (g0..(g0 + group).min(heads)).map(move |h| (t * heads + h) as i32))
        })
        .collect()
}

/// Query heads per group the work lists aim for ([`longest_first`]): with ~130 CTAs in flight,
/// groups of 2 heads read each K/V tile (forward) and Q/dO/dQ tile (backward's downward walk)
/// from L2 where a tile's 16 heads side by side read them ~2x from DRAM (docs/perf.md "Session
/// 28": forward -3% at 1x65536, -9% at 4x16384; backward -4% / -8%).
pub const HEAD_GROUP: usize = 2;

/// Bytes of Q/dO/dQ rows the backward's downward-walking items of one head group may span before
/// smaller groups are taken: a smaller group has more of one head's key tiles in flight, each
/// waiting at every query tile for the lower key tiles' dQ partials (a longer semaphore
/// pipeline), which only pays where the larger group's rows would not stay in the 50 MB L2
/// (docs/perf.md "Session 28": two heads -3% at 4x16384 d = 64 (64 MiB), +3% at the lognormal
/// workload's 4-head chunks at d = 64 (29 MiB)).
pub const BWD_GROUP_BYTES: usize = 64 << 20;

/// Key tiles of one (document, head) the backward's downward walk may have in flight before
/// larger head groups are taken: they all start on the document's last query tile and wait
/// there, and at each query tile after, for the lower key tiles' dQ partials, so the pipeline
/// grows with them (docs/perf.md "Session 28": at 1x65536, 66 per chain with two heads measured
/// 0.6% slower than 33 with four; at the lognormal workload's one long document, +3% at d = 64).
pub const BWD_CHAIN_TILES: usize = 40;

/// The backward's head group for `one` (its list with every head at once) on `ctas` CTAs: whole
/// GQA groups, at least [`HEAD_GROUP`] heads and enough that `ctas` items spread over the
/// downward-walking documents hold at most [`BWD_CHAIN_TILES`] key tiles per (document, head);
/// doubling while twice the group's downward-walk bytes (Q and dO tiles in both layouts and the
/// FP32 dQ rows: 8 bytes per token and dim, over the documents that walk down) stay within
/// [`BWD_GROUP_BYTES`]; at most a chunk's heads.
fn bwd_head_group(one: &BwdSchedule, shape: &VarlenShape, ctas: usize) -> usize {
    let (hq, hkv) = (shape.heads_q, shape.heads_kv);
    let firsts = || one.tiles.iter().filter(|t| t[7] == 0 && t[3] == 0);
    let per_head = firsts().map(|t| t[1] as usize).sum::<usize>() * 8 * shape.head_dim;
    let chains = ctas.div_ceil(BWD_CHAIN_TILES * firsts().count().max(1));
    let chunk = one.chunk_heads(hq);
    let mut g = whole_gqa_groups(Some(HEAD_GROUP.max(chains)), hq, hkv);
    while g < chunk && 2 * g * per_head <= BWD_GROUP_BYTES {
        g = whole_gqa_groups(Some(2 * g), hq, hkv);
    }
    g.min(chunk)
}

/// How much longer than every head's at once ([`list_makespan`]) a list of smaller head groups
/// may run before larger groups are taken: where one document's long items would wait for the
/// earlier groups (a long document among short ones), groups cost a tail.
const HEAD_GROUP_SLACK: f64 = 0.01;

/// Makespan of items of `costs` taken in list order by `ctas` persistent CTAs, each by the CTA
/// that frees first, one unit more per item (its prologue and epilogue).
fn list_makespan(costs: impl IntoIterator<Item = usize>, ctas: usize) -> usize {
    use std::cmp::Reverse;
    let mut free: std::collections::BinaryHeap<Reverse<usize>> =
        std::iter::repeat_n(Reverse(0), ctas.max(1)).collect();
    let mut end = 0;
    for c in costs {
        let Reverse(t) = free.pop().unwrap_or(Reverse(0));
        end = end.max(t + c + 1);
        free.push(Reverse(t + c + 1));
    }
    end
}

/// Mean key tiles per query tile below which the forward keeps every head at once: a query
/// tile's K/V is then read by about one item, so groups save no DRAM reads, and with fewer heads
/// in flight each Q/K/V/O box covers 128 bytes of every token's 2 KB row instead of the whole
/// rows side by side (docs/perf.md "Session 28": two-head groups measured the forward +6% at
/// 256x256, mean 1.5; -1.5% at 64x1024, 4.5; -3..-8% from 32x2048, 8.5, up).
pub const FWD_GROUP_MIN_TILES: f64 = 4.0;

/// Bytes of each token's K (and V) code row the forward's head group spans at least: two heads
/// at d = 128, four at d = 64. At d = 64 two heads read 128 contiguous bytes of every token's row
/// and measured the forward +0..+7% slower than four (docs/perf.md "Session 29": lognormal 1.78
/// -> 1.67 ms, 64x1024 0.435 -> 0.430, level at 1x65536 and 4x16384), while at d = 128 four heads
/// were +0..+4% slower than two at 64x1024..4x16384.
pub const FWD_GROUP_ROW_BYTES: usize = 256;

/// `group` query heads (every head when `None` or 0) rounded up to whole GQA groups, at most
/// `heads_q`.
fn whole_gqa_groups(group: Option<usize>, heads_q: usize, heads_kv: usize) -> usize {
    let per_kv = (heads_q / heads_kv.max(1)).max(1);
    group
        .filter(|&g| g > 0)
        .map_or(heads_q, |g| g.div_ceil(per_kv) * per_kv)
        .min(heads_q)
}

/// The v4 forward's work list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FwdSchedule {
    /// `{doc start, doc length, padded doc start, tile offset in doc}` per 128-token query tile,
    /// in document order.
    pub tiles: Vec<[i32; 4]>,
    /// `tile * heads_q + head`, longest first.
    pub items: Vec<i32>,
    /// Key tiles the query tiles visit, summed over the tiles (one head).
    pub key_tiles: usize,
    /// Query heads per group of `items` ([`longest_first`]).
    pub head_group: usize,
}

impl FwdSchedule {
    /// Tiles and items of `shape`; `pad_starts` are the documents' starts in the dim-major
    /// copies (the plan's padded layout).
    pub fn new(shape: &VarlenShape, pad_starts: &[usize], causal: bool) -> Self {
        Self::grouped(shape, pad_starts, causal, shape.heads_q)
    }

    /// [`FwdSchedule::new`] with the items in head groups for a launch of `ctas` persistent CTAs:
    /// `FLAMIA_FWD_HEAD_GROUP` when set (an A/B knob); else every head at once below
    /// [`FWD_GROUP_MIN_TILES`], otherwise the smallest of [`HEAD_GROUP`] (at least
    /// [`FWD_GROUP_ROW_BYTES`] of each token's K row: four heads at d = 64), doubling, whose list's
    /// [`list_makespan`] is within [`HEAD_GROUP_SLACK`] of every head's at once; rounded up to
    /// whole GQA groups, so the query heads sharing a KV head stay adjacent (their K/V in L2).
    pub fn for_ctas(shape: &VarlenShape, pad_starts: &[usize], causal: bool, ctas: usize) -> Self {
        let build = |g| Self::grouped(shape, pad_starts, causal, g);
        let (hq, hkv) = (shape.heads_q, shape.heads_kv);
        if let Some(g) = super::env_number::<usize>("FLAMIA_FWD_HEAD_GROUP") {
            return build(whole_gqa_groups(Some(g), hq, hkv));
        }
        let one = build(hq);
        if one.mean_key_tiles() < FWD_GROUP_MIN_TILES {
            return one;
        }
        let makespan = |s: &Self| list_makespan((0..s.items.len()).map(|i| s.item_cost(i, hq, causal)), ctas);
        let bound = makespan(&one) as f64 * (1.0 + HEAD_GROUP_SLACK);
        let first = HEAD_GROUP.max(FWD_GROUP_ROW_BYTES.div_ceil(shape.head_dim.max(1)));
        let mut g = whole_gqa_groups(Some(first), hq, hkv);
        while g < hq {
            let s = build(g);
            if makespan(&s) as f64 <= bound {
                return s;
            }
            g = whole_gqa_groups(Some(2 * g), hq, hkv);
        }
        one
    }

    /// [`FwdSchedule::new`] with the items in groups of `head_group` query heads
    /// ([`longest_first`]).
    pub fn grouped(shape: &VarlenShape, pad_starts: &[usize], causal: bool, head_group: usize) -> Self {
        let mut tiles = Vec::new();
        let mut cost = Vec::new();
        for (d, w) in shape.cu_seqlens.windows(2).enumerate() {
            let (s, len) = (w[0], w[1] - w[0]);
            for q0 in (0..len).step_by(FWD_QT) {
                tiles.push([s as i32, len as i32, pad_starts[d] as i32, q0 as i32]);
                cost.push(key_tiles(len, q0, causal));
            }
        }
        let items = longest_first((0..cost.len()).collect(), &cost, shape.heads_q, head_group);
        let key_tiles = cost.iter().sum();
        FwdSchedule {
            tiles,
            items,
            key_tiles,
            head_group: head_group.clamp(1, shape.heads_q),
        }
    }

    /// Mean key tiles per query tile: how long the forward's items run on average.
    pub fn mean_key_tiles(&self) -> f64 {
        self.key_tiles as f64 / self.tiles.len().max(1) as f64
    }

    /// Key tiles visited by item `i` (the cost it was sorted by).
    pub fn item_cost(&self, i: usize, heads_q: usize, causal: bool) -> usize {
        let t = self.tiles[self.items[i] as usize / heads_q];
        let (len, q0) = (t[1] as usize, t[3] as usize);
        key_tiles(len, q0, causal)
    }
}

/// Keys per work item of the v4 backward (two consumer warpgroups of 64 keys).
pub const BWD_KT: usize = 128;
/// Queries per step of the v4 backward.
pub const BWD_QT: usize = 64;

/// 64-query steps a 128-key tile at `k0` of a `len`-token document walks (causal: from the tile
/// on); the same count as `bwd_steps` in `cuda/attn_bwd_v4.cu`.
fn query_steps(len: usize, k0: usize, causal: bool) -> usize {
    let start = if causal { k0 } else { 0 };
    (len - start).div_ceil(BWD_QT)
}

/// Default of [`bwd_up_tiles`]: documents of up to 128 key tiles (16,384 tokens) walk up (64
/// until session 32, whose same-call A/B put 128 at -1.5% (d = 128) to -8% (d = 64, GQA) of the
/// training call at 4x16384 and -1..-6% on lognormal; 256 lost 1.5% at 2x32768).
pub const BWD_UP_TILES: usize = 128;

/// Largest document, in 128-key tiles, whose key tiles walk up (causal only; the module docs):
/// `FLAMIA_BWD_UP_TILES` when set (an A/B knob), else [`BWD_UP_TILES`].
pub fn bwd_up_tiles() -> usize {
    super::env_number("FLAMIA_BWD_UP_TILES").unwrap_or(BWD_UP_TILES)
}

/// Document-relative start of the 64-query tile that step `st` of `tile` (a [`BwdSchedule::tiles`]
/// row) walks: from the document's last query tile down to the diagonal, or from the diagonal up
/// where the tile walks up; the kernel's `load_stage` and consumer loops.
pub fn bwd_step_query(tile: &[i32; 8], causal: bool, st: usize) -> usize {
    let (len, k0) = (tile[1] as usize, tile[3] as usize);
    let start = if causal { k0 } else { 0 };
    let n = query_steps(len, k0, causal);
    if tile[7] != 0 {
        start + BWD_QT * st
    } else {
        start + BWD_QT * (n - 1 - st)
    }
}

/// The dQ partials (two per key tile: one per consumer warpgroup) that the query tile at `q0` of
/// the document must have taken before those of `tile`: every lower key tile's (walking down) or
/// every higher one's that sees it (walking up, causal); the kernel's `BwdDqJob::target`.
pub fn bwd_dq_turn(tile: &[i32; 8], q0: usize) -> usize {
    let kt = tile[3] as usize / BWD_KT;
    2 * if tile[7] != 0 { q0 / BWD_KT - kt } else { kt }
}

/// Bytes the v4 backward's per-chunk scratch (FP32 dQ accumulator, GQA dK/dV partials) may take
/// before the query heads are split into chunks (`FLAMIA_BWD_SCRATCH_MIB` overrides it).
pub const BWD_SCRATCH_BUDGET: usize = 256 << 20;

/// The budget when every document walks up (module docs): one launch where
/// [`BWD_SCRATCH_BUDGET`] would take two (+256 MiB at a 65,536-token row and 16 heads).
pub const BWD_SCRATCH_BUDGET_UP: usize = 512 << 20;

/// `FLAMIA_BWD_SCRATCH_MIB` MiB when set (a development and test knob, taken whatever the
/// documents), else `None`: [`BwdSchedule::new`] picks [`BWD_SCRATCH_BUDGET`] or
/// [`BWD_SCRATCH_BUDGET_UP`].
pub fn bwd_scratch_budget() -> Option<usize> {
    super::env_number::<usize>("FLAMIA_BWD_SCRATCH_MIB").map(|m| m << 20)
}

/// Scratch bytes of one chunk of `heads_q / chunks` query heads: the FP32 dQ accumulator (`rows`:
/// the padded positions, every document's 64-query tiles, which also bound the token rows) and,
/// for GQA, one FP32 dK and dV partial per (128-key tile, KV head).
pub fn bwd_scratch_bytes(
    rows: usize,
    key_tiles: usize,
    heads_q: usize,
    heads_kv: usize,
    chunks: usize,
) -> usize {
    let dq = rows * (heads_q / chunks) * 128 * 4;
    let dkv = if heads_q != heads_kv {
        key_tiles * (heads_kv / chunks) * 2 * BWD_KT * 128 * 4
    } else {
        0
    };
    dq + dkv
}

/// The fewest head chunks (a divisor of `heads_kv`, so every chunk holds whole GQA groups) whose
/// scratch fits `budget`; `heads_kv` chunks when none does.
pub fn bwd_head_chunks(
    rows: usize,
    key_tiles: usize,
    heads_q: usize,
    heads_kv: usize,
    budget: usize,
) -> usize {
    (1..=heads_kv)
        .filter(|c| heads_kv.is_multiple_of(*c))
        .find(|&c| bwd_scratch_bytes(rows, key_tiles, heads_q, heads_kv, c) <= budget)
        .unwrap_or(heads_kv)
}

/// The v4 backward's work list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BwdSchedule {
    /// Per 128-key tile, in document order: `{doc start, doc length, padded doc start, tile
    /// offset in doc, the document's first 64-query tile (global index), this key tile's global
    /// index, 0, 1 if it walks up}` (`struct BwdTile`).
    pub tiles: Vec<[i32; 8]>,
    /// `tile * heads_q + head`: chunk by chunk (heads `c * heads_q / chunks ..`), each longest
    /// first, then the documents that walk up, head by head (module docs).
    pub items: Vec<i32>,
    /// 64-query tiles over all documents (the dQ semaphores per head).
    pub query_tiles: usize,
    /// Query-head chunks, one launch each ([`bwd_head_chunks`]).
    pub chunks: usize,
    /// Query heads per group of the downward-walking items ([`longest_first`]), at most a chunk's.
    pub head_group: usize,
    /// The work list of the kernel's CTA pairs (`BWD_PAIR`): the items of `items` whose tile is
    /// the lower of a pair, tiles 0-1, 2-3, ... of each document (a document's last tile alone
    /// when it has an odd number), in `items`' order, so chunk by chunk with the same count per
    /// chunk ([`BwdSchedule::pair_range`]). A pair walks its lower tile's query tiles, so its
    /// cost is that tile's and the downward-walking pairs stay longest first; a pair only ever
    /// waits for the dQ partials of pairs listed before it (lower tiles walking down, higher
    /// ones walking up, where a document's pairs are listed highest first).
    pub pairs: Vec<i32>,
}

impl BwdSchedule {
    /// Tiles and items of `shape` (`pad_starts` as for [`FwdSchedule::new`]), the heads split
    /// into chunks when the scratch would exceed `scratch_budget` bytes (`None`: the default
    /// rule, [`BWD_SCRATCH_BUDGET`] or, when every document walks up, [`BWD_SCRATCH_BUDGET_UP`]),
    /// causal documents of at most `up_tiles` key tiles walking up.
    pub fn new(
        shape: &VarlenShape,
        pad_starts: &[usize],
        causal: bool,
        scratch_budget: Option<usize>,
        up_tiles: usize,
    ) -> Self {
        let heads = shape.heads_q;
        Self::grouped(shape, pad_starts, causal, scratch_budget, up_tiles, heads)
    }

    /// [`BwdSchedule::new`] with the downward-walking items in head groups for launches of
    /// `ctas` persistent CTAs ([`bwd_head_group`]; `FLAMIA_BWD_HEAD_GROUP` sets the group: an A/B
    /// knob).
    pub fn with_head_groups(
        shape: &VarlenShape,
        pad_starts: &[usize],
        causal: bool,
        scratch_budget: Option<usize>,
        up_tiles: usize,
        ctas: usize,
    ) -> Self {
        let build = |g| Self::grouped(shape, pad_starts, causal, scratch_budget, up_tiles, g);
        let (hq, hkv) = (shape.heads_q, shape.heads_kv);
        if let Some(g) = super::env_number::<usize>("FLAMIA_BWD_HEAD_GROUP") {
            return build(whole_gqa_groups(Some(g), hq, hkv));
        }
        let one = build(hq);
        let g = bwd_head_group(&one, shape, ctas);
        if g >= one.chunk_heads(hq) {
            one
        } else {
            build(g)
        }
    }

    /// [`BwdSchedule::new`] with the downward-walking items in groups of `head_group` query heads
    /// ([`longest_first`]; within a chunk when the groups are smaller than it).
    pub fn grouped(
        shape: &VarlenShape,
        pad_starts: &[usize],
        causal: bool,
        scratch_budget: Option<usize>,
        up_tiles: usize,
        head_group: usize,
    ) -> Self {
        let mut tiles = Vec::new();
        let mut cost = Vec::new();
        let mut up_docs = Vec::new(); // (length, first tile, end tile)
        let mut qt0 = 0usize;
        for (d, w) in shape.cu_seqlens.windows(2).enumerate() {
            let (s, len) = (w[0], w[1] - w[0]);
            let up = causal && len.div_ceil(BWD_KT) <= up_tiles;
            if up {
                up_docs.push((len, tiles.len(), tiles.len() + len.div_ceil(BWD_KT)));
            }
            for k0 in (0..len).step_by(BWD_KT) {
                let kt = tiles.len();
                tiles.push([
                    s as i32,
                    len as i32,
                    pad_starts[d] as i32,
                    k0 as i32,
                    qt0 as i32,
                    kt as i32,
                    0,
                    up as i32,
                ]);
                cost.push(query_steps(len, k0, causal));
            }
            qt0 += len.div_ceil(BWD_QT);
        }
        let (hq, hkv) = (shape.heads_q, shape.heads_kv);
        let all_up = up_docs.len() == shape.cu_seqlens.len() - 1;
        let budget = scratch_budget.unwrap_or(if all_up {
            BWD_SCRATCH_BUDGET_UP
        } else {
            BWD_SCRATCH_BUDGET
        });
        let chunks = bwd_head_chunks(qt0 * BWD_QT, tiles.len(), hq, hkv, budget);
        let down = (0..tiles.len()).filter(|&t| tiles[t][7] == 0).collect();
        let mut all = longest_first(down, &cost, hq, head_group);
        up_docs.sort_by_key(|&(len, first, _)| (std::cmp::Reverse(len), first));
        // each head's key tiles of a document together: they share its Q/dO tiles and dQ rows
        // (bench/sched_model.py --l2: at 16x4096 2.0 GB of DRAM traffic against 21.8 with the
        // heads of a tile adjacent, whose ~130 items in flight span every head)
        all.extend(up_docs.iter().flat_map(|&(_, a, b)| {
            (0..hq).flat_map(move |h| (a..b).rev().map(move |t| (t * hq + h) as i32))
        }));
        let hc = hq / chunks;
        let items: Vec<i32> = (0..chunks)
            .flat_map(|c| all.iter().copied().filter(move |&it| it as usize % hq / hc == c))
            .collect();
        let lower = |&it: &i32| (tiles[it as usize / hq][3] as usize / BWD_KT).is_multiple_of(2);
        let pairs = items.iter().copied().filter(lower).collect();
        BwdSchedule {
            tiles,
            items,
            query_tiles: qt0,
            chunks,
            head_group: head_group.clamp(1, hc),
            pairs,
        }
    }

    /// Whether any tile walks up (the kernel is then built with `BWD_WALK_UP`).
    pub fn walks_up(&self) -> bool {
        self.tiles.iter().any(|t| t[7] != 0)
    }

    /// Whether every tile walks up (at least one tile, none walking down).
    pub fn all_up(&self) -> bool {
        !self.tiles.is_empty() && self.tiles.iter().all(|t| t[7] != 0)
    }

    /// The (query head, 64-query tile) units of `bwd_dq_follow` (`FLAMIA_BWD_FOLLOWERS`), chunk
    /// by chunk (`chunk_heads` heads each, `query_tiles` units per head), each chunk's in the
    /// order the fused kernel finishes them: where every tile walks up, a document's key tile 0
    /// is the last of its query tiles' contributors and walks them from the first, so the units
    /// follow the chunk's tile-0 items in list order, each item's query tiles ascending. A unit is
    /// `(head - chunk's first head) * query_tiles + global query tile`. Empty unless
    /// [`BwdSchedule::all_up`].
    pub fn dq_units(&self, heads_q: usize) -> Vec<i32> {
        if !self.all_up() {
            return Vec::new();
        }
        let hc = self.chunk_heads(heads_q);
        let nqt = self.query_tiles;
        let mut units = Vec::with_capacity(heads_q * nqt);
        for c in 0..self.chunks {
            for &it in &self.items[self.chunk_range(c)] {
                let (t, h) = (it as usize / heads_q, it as usize % heads_q);
                let tile = &self.tiles[t];
                if tile[3] != 0 {
                    continue;
                }
                let (len, qt0) = (tile[1] as usize, tile[4] as usize);
                units.extend((0..len.div_ceil(BWD_QT)).map(|q| ((h - c * hc) * nqt + qt0 + q) as i32));
            }
        }
        units
    }

    /// Query heads per chunk.
    pub fn chunk_heads(&self, heads_q: usize) -> usize {
        heads_q / self.chunks
    }

    /// The items of chunk `c` (a contiguous range of `items`).
    pub fn chunk_range(&self, c: usize) -> std::ops::Range<usize> {
        let n = self.items.len() / self.chunks;
        c * n..(c + 1) * n
    }

    /// The pairs of chunk `c` (a contiguous range of `pairs`).
    pub fn pair_range(&self, c: usize) -> std::ops::Range<usize> {
        let n = self.pairs.len() / self.chunks;
        c * n..(c + 1) * n
    }

    /// Steps walked by item `i` (the cost it was sorted by).
    pub fn item_cost(&self, i: usize, heads_q: usize, causal: bool) -> usize {
        let t = self.tiles[self.items[i] as usize / heads_q];
        query_steps(t[1] as usize, t[3] as usize, causal)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pads(shape: &VarlenShape) -> Vec<usize> {
        let mut p = 0;
        shape
            .cu_seqlens
            .windows(2)
            .map(|w| {
                let s = p;
                p += (w[1] - w[0]).div_ceil(64) * 64;
                s
            })
            .collect()
    }

    #[test]
    fn items_cover_every_tile_and_head_once_longest_first() {
        let shape = VarlenShape::from_lens(&[100, 1000, 129, 256], 4, 2, 128).unwrap();
        for causal in [true, false] {
            let s = FwdSchedule::new(&shape, &pads(&shape), causal);
            // tiles: 1 + 8 + 2 + 2
            assert_eq!(s.tiles.len(), 13);
            let mut seen = s.items.clone();
            seen.sort();
            assert_eq!(seen, (0..13 * 4).collect::<Vec<i32>>());
            let costs: Vec<usize> = (0..s.items.len()).map(|i| s.item_cost(i, 4, causal)).collect();
            assert!(costs.windows(2).all(|w| w[0] >= w[1]), "{costs:?}");
            // heads of one tile are adjacent
            for c in s.items.chunks(4) {
                assert!(c.iter().all(|x| x / 4 == c[0] / 4));
                assert_eq!(c.iter().map(|x| x % 4).collect::<Vec<_>>(), vec![0, 1, 2, 3]);
            }
        }
    }

    #[test]
    fn head_groups_take_every_item_once_each_group_longest_first() {
        let shape = VarlenShape::from_lens(&[100, 1000, 129, 256], 8, 4, 128).unwrap();
        let one = FwdSchedule::new(&shape, &pads(&shape), true);
        assert_eq!(FwdSchedule::grouped(&shape, &pads(&shape), true, 8), one);
        for group in [1, 2, 4] {
            let s = FwdSchedule::grouped(&shape, &pads(&shape), true, group);
            let mut seen = s.items.clone();
            seen.sort();
            assert_eq!(seen, (0..13 * 8).collect::<Vec<i32>>());
            for (g, items) in s.items.chunks(13 * group).enumerate() {
                // the group's heads only, each tile's heads adjacent, the tiles longest first
                assert!(items.iter().all(|&it| it as usize % 8 / group == g));
                let costs: Vec<usize> = items
                    .iter()
                    .map(|&it| {
                        key_tiles(
                            s.tiles[it as usize / 8][1] as usize,
                            s.tiles[it as usize / 8][3] as usize,
                            true,
                        )
                    })
                    .collect();
                assert!(costs.windows(2).all(|w| w[0] >= w[1]), "group {g}: {costs:?}");
                for c in items.chunks(group) {
                    assert!(c.iter().all(|x| x / 8 == c[0] / 8));
                }
            }
        }
        // rounded up to whole GQA groups (2 query heads per KV head here), at most every head
        assert_eq!(whole_gqa_groups(Some(1), 8, 4), 2);
        assert_eq!(whole_gqa_groups(Some(3), 8, 4), 4);
        assert_eq!(whole_gqa_groups(Some(64), 8, 4), 8);
        assert_eq!(whole_gqa_groups(Some(0), 8, 4), 8);
        assert_eq!(whole_gqa_groups(None, 8, 8), 8);
        assert_eq!(whole_gqa_groups(Some(1), 8, 8), 1);
    }

    #[test]
    fn head_groups_are_two_heads_where_they_keep_rows_in_l2_and_no_document_waits() {
        let group = |lens: &[usize], hq, hkv, hd| {
            let shape = VarlenShape::from_lens(lens, hq, hkv, hd).unwrap();
            let p = pads(&shape);
            let f = FwdSchedule::for_ctas(&shape, &p, true, 132);
            let b = BwdSchedule::with_head_groups(&shape, &p, true, None, BWD_UP_TILES, 132);
            (f.head_group, b.head_group, b.chunk_heads(hq))
        };
        // long documents of one length: two heads (GQA: whole groups of 4 query heads); the
        // backward in chunks of 8 heads (two launches, the scratch budget), four heads for one
        // document (33 of its key tiles per head in flight, not 66); documents of 16,384 tokens
        // walk up (BWD_UP_TILES = 128): one launch, one group, as the short documents below
        assert_eq!(group(&[65536], 16, 16, 128), (2, 4, 8));
        assert_eq!(group(&[16384; 4], 16, 16, 128), (2, 16, 16));
        // (d = 64: the forward's groups of four heads read 256 bytes of each token's K/V row)
        assert_eq!(group(&[16384; 4], 16, 16, 64), (4, 16, 16));
        assert_eq!(group(&[65536], 16, 16, 64), (4, 4, 8));
        assert_eq!(group(&[1024; 64], 16, 16, 64), (4, 16, 16));
        assert_eq!(group(&[16384; 4], 32, 8, 64), (4, 8, 8));
        assert_eq!(group(&[16384; 4], 32, 8, 128), (4, 8, 8));
        // short documents all walk up: the backward's list is one group; the forward's query
        // tiles of 256 tokens (1.5 key tiles each) read their K/V once whatever the order
        assert_eq!(group(&[256; 256], 16, 16, 128), (16, 16, 16));
        // 1,024-token documents (4.5 key tiles per query tile) group, 512-token ones (2.5) not
        assert_eq!(group(&[1024; 64], 16, 16, 128), (2, 16, 16));
        assert_eq!(group(&[512; 128], 16, 16, 128), (16, 16, 16));
        // the lognormal workload (21 key tiles per query tile: the forward groups): every
        // document walks up (the longest, 14,975 tokens, is 117 key tiles), in two chunks of 8
        // heads (its padded row's dQ accumulator is past the larger budget), each one group
        let lognormal = crate::gpu::bench::workload("lognormal").unwrap();
        assert_eq!(group(&lognormal, 16, 16, 64), (4, 8, 8));
        assert_eq!(group(&lognormal, 16, 16, 128), (2, 8, 8));
        let shape = VarlenShape::from_lens(&lognormal, 16, 16, 64).unwrap();
        let b = BwdSchedule::with_head_groups(&shape, &pads(&shape), true, None, BWD_UP_TILES, 132);
        assert_eq!(
            b,
            BwdSchedule::new(&shape, &pads(&shape), true, None, BWD_UP_TILES)
        );
        // one 8,192-token document among 224 of 256 tokens: in groups of two heads its longest
        // query tiles (64 key tiles) would start after 7/8 of the forward's work (+5% makespan)
        let mixed: Vec<usize> = std::iter::once(8192)
            .chain(std::iter::repeat_n(256, 224))
            .collect();
        let (f, _, _) = group(&mixed, 16, 16, 128);
        assert!(f > 2, "{f}");
        let shape = VarlenShape::from_lens(&mixed, 16, 16, 128).unwrap();
        let makespan = |g| {
            let s = FwdSchedule::grouped(&shape, &pads(&shape), true, g);
            list_makespan((0..s.items.len()).map(|i| s.item_cost(i, 16, true)), 132)
        };
        assert!(makespan(2) as f64 > 1.03 * makespan(16) as f64);
        assert!(makespan(f) as f64 <= 1.01 * makespan(16) as f64);
    }

    #[test]
    fn list_makespan_takes_each_item_on_the_first_free_cta() {
        // one unit of overhead per item
        assert_eq!(list_makespan([4, 1, 1, 1], 2), 6);
        assert_eq!(list_makespan([1, 1, 1, 4], 2), 7);
        assert_eq!(list_makespan([3; 6], 3), 8);
        assert_eq!(list_makespan([], 3), 0);
    }

    #[test]
    fn mean_key_tiles_follow_the_documents() {
        // causal: query tile i of a document visits i + 1 key tiles; not causal, all of them
        let mean = |lens: &[usize], causal| {
            let shape = VarlenShape::from_lens(lens, 2, 2, 128).unwrap();
            FwdSchedule::new(&shape, &pads(&shape), causal).mean_key_tiles()
        };
        assert_eq!(mean(&[65536], true), 256.5);
        assert_eq!(mean(&[4096; 4], true), 16.5);
        assert_eq!(mean(&[256; 8], true), 1.5);
        assert_eq!(mean(&[1000], false), 8.0);
        // 8192 + 224 x 256: (64 tiles x 32.5 + 448 tiles x 1.5) / 512
        let mixed: Vec<usize> = std::iter::once(8192)
            .chain(std::iter::repeat_n(256, 224))
            .collect();
        assert_eq!(mean(&mixed, true), (64.0 * 32.5 + 448.0 * 1.5) / 512.0);
    }

    #[test]
    fn tiles_restart_at_documents_with_padded_starts() {
        let shape = VarlenShape::from_lens(&[1, 300], 1, 1, 128).unwrap();
        let s = FwdSchedule::new(&shape, &pads(&shape), true);
        assert_eq!(
            s.tiles,
            vec![
                [0, 1, 0, 0],
                [1, 300, 64, 0],
                [1, 300, 64, 128],
                [1, 300, 64, 256]
            ]
        );
        // causal costs 1, 1, 2, 3: the 300-token document's last tile goes first
        assert_eq!(s.items, vec![3, 2, 0, 1]);
    }

    #[test]
    fn backward_items_take_each_documents_key_tiles_in_ascending_order() {
        let shape = VarlenShape::from_lens(&[100, 1000, 129, 256], 4, 2, 128).unwrap();
        for causal in [true, false] {
            let s = BwdSchedule::new(&shape, &pads(&shape), causal, Some(BWD_SCRATCH_BUDGET), 0);
            // key tiles: 1 + 8 + 2 + 2; 64-query tiles: 2 + 16 + 3 + 4
            assert_eq!(s.tiles.len(), 13);
            assert_eq!(s.query_tiles, 25);
            let mut seen = s.items.clone();
            seen.sort();
            assert_eq!(seen, (0..13 * 4).collect::<Vec<i32>>());
            let costs: Vec<usize> = (0..s.items.len()).map(|i| s.item_cost(i, 4, causal)).collect();
            assert!(costs.windows(2).all(|w| w[0] >= w[1]), "{costs:?}");
            // The semaphore order: within one document and head, key tiles in ascending order;
            // within one key tile, heads in ascending order.
            let mut last: std::collections::HashMap<(i32, usize), i32> = Default::default();
            for (n, &it) in s.items.iter().enumerate() {
                let (t, h) = (it as usize / 4, it as usize % 4);
                let tile = s.tiles[t];
                if let Some(prev) = last.insert((tile[0], h), tile[3]) {
                    assert!(prev < tile[3], "item {n}: key tile {} after {prev}", tile[3]);
                }
                assert_eq!(tile[5] as usize, t);
            }
            for c in s.items.chunks(4) {
                assert_eq!(c.iter().map(|x| x % 4).collect::<Vec<_>>(), vec![0, 1, 2, 3]);
            }
        }
        // the 1000-token document's first 64-query tile is global tile 2 (after the 100-token doc)
        let s = BwdSchedule::new(&shape, &pads(&shape), true, Some(BWD_SCRATCH_BUDGET), 0);
        assert_eq!(s.tiles[1], [100, 1000, 128, 0, 2, 1, 0, 0]);
    }

    /// Per (head, global query tile): the key tiles in the order their partials went in
    /// ([`simulate`], [`simulate_pairs`]), and the semaphore.
    type Turns = std::collections::HashMap<(usize, usize), Vec<usize>>;
    type Sems = std::collections::HashMap<(usize, usize), usize>;

    /// `workers` persistent workers take `items` work items in list order as they free up, each
    /// item's steps `0..steps(i)` in turn; `step(i, st, sem, order)` moves step `st` of item `i`
    /// when its partials' turns have come (returns whether it moved). Returns the order; panics
    /// on a deadlock (no worker can move).
    fn run_workers(
        items: usize,
        workers: usize,
        steps: impl Fn(usize) -> usize,
        mut step: impl FnMut(usize, usize, &mut Sems, &mut Turns) -> bool,
    ) -> Turns {
        let (mut sem, mut order) = (Sems::default(), Turns::default());
        let mut next = 0usize;
        let mut run: Vec<Option<(usize, usize)>> = vec![None; workers]; // (item, step)
        loop {
            let mut moved = false;
            for slot in run.iter_mut() {
                if slot.is_none() && next < items {
                    *slot = Some((next, 0));
                    next += 1;
                    moved = true;
                }
                let Some((i, st)) = *slot else { continue };
                if !step(i, st, &mut sem, &mut order) {
                    continue;
                }
                moved = true;
                *slot = (st + 1 < steps(i)).then_some((i, st + 1));
            }
            if run.iter().all(Option::is_none) && next == items {
                return order;
            }
            assert!(
                moved,
                "deadlock with {workers} workers: items {run:?} wait, {next} taken"
            );
        }
    }

    /// The partial of `tile` (head `h`) for its step's query tile `q0`, if its turn has come
    /// (its semaphore holds [`bwd_dq_turn`]; it then adds 2, as the kernel's two reducers do).
    fn take_turn(tile: &[i32; 8], h: usize, q0: usize, sem: &mut Sems, order: &mut Turns) -> bool {
        let key = (h, tile[4] as usize + q0 / BWD_QT);
        let have = sem.entry(key).or_default();
        if *have < bwd_dq_turn(tile, q0) {
            return false;
        }
        assert_eq!(*have, bwd_dq_turn(tile, q0), "a partial went in out of turn");
        *have += 2;
        order.entry(key).or_default().push(tile[3] as usize / BWD_KT);
        true
    }

    /// Runs `s` on `ctas` persistent CTAs that take the items in list order as they free up,
    /// each step of an item waiting until its query tile's semaphore holds the item's turn
    /// (`bwd_dq_turn`) and then adding 2, as the kernel's reducers do (the whole step at once: a
    /// CTA holds one item). Returns, per (head, global query tile), the key tiles in the order
    /// their partials went in; panics on a deadlock (no CTA can move).
    fn simulate(s: &BwdSchedule, heads_q: usize, causal: bool, ctas: usize) -> Turns {
        let item = |i: usize| {
            (
                &s.tiles[s.items[i] as usize / heads_q],
                s.items[i] as usize % heads_q,
            )
        };
        run_workers(
            s.items.len(),
            ctas,
            |i| query_steps(item(i).0[1] as usize, item(i).0[3] as usize, causal),
            |i, st, sem, order| {
                let (tile, h) = item(i);
                take_turn(tile, h, bwd_step_query(tile, causal, st), sem, order)
            },
        )
    }

    /// [`simulate`] for the kernel's CTA pairs (`BWD_PAIR`): `clusters` clusters take the pairs
    /// in list order, and a pair's two CTAs walk the lower tile's query tiles in step (their rings
    /// are one): at each step the pair's first partial in the query tile's order (the lower
    /// tile's walking down, the upper's walking up, when the upper tile sees that query tile)
    /// waits for its turn and the other goes in right after it. Returns the order as
    /// [`simulate`]; panics on a deadlock or a partial out of turn.
    fn simulate_pairs(s: &BwdSchedule, heads_q: usize, causal: bool, clusters: usize) -> Turns {
        let pair = |i: usize| (s.pairs[i] as usize / heads_q, s.pairs[i] as usize % heads_q);
        let upper = |t: usize| {
            let (lo, up) = (&s.tiles[t], s.tiles.get(t + 1)?);
            (up[0] == lo[0] && up[3] == lo[3] + BWD_KT as i32).then_some(up)
        };
        run_workers(
            s.pairs.len(),
            clusters,
            |i| {
                query_steps(
                    s.tiles[pair(i).0][1] as usize,
                    s.tiles[pair(i).0][3] as usize,
                    causal,
                )
            },
            |i, st, sem, order| {
                let (t, h) = pair(i);
                let lo = &s.tiles[t];
                let q0 = bwd_step_query(lo, causal, st);
                let mut both = vec![lo];
                both.extend(upper(t).filter(|up| !causal || q0 >= up[3] as usize));
                if lo[7] != 0 {
                    both.reverse(); // walking up: the higher key tile's partial first
                }
                if !take_turn(both[0], h, q0, sem, order) {
                    return false;
                }
                if let Some(second) = both.get(1) {
                    assert!(
                        take_turn(second, h, q0, sem, order),
                        "the pair's second partial out of turn"
                    );
                }
                true
            },
        )
    }

    #[test]
    fn cta_pairs_cover_every_tile_once_and_take_the_partials_in_turn() {
        // key tiles: 1 + 9 + 2 + 5 + 17 (odd counts leave a document's last tile alone); heads in
        // chunks (a budget of 0 bytes: one KV head per chunk) and not
        let lens = [100, 1100, 129, 600, 2100];
        let budget = Some(BWD_SCRATCH_BUDGET);
        // every document walking down, or those of at most 5 key tiles walking up
        let cases = [
            (true, budget, 0),
            (false, budget, 0),
            (true, Some(0), 0),
            (true, budget, 5),
        ];
        for (causal, budget, up_tiles) in cases {
            let shape = VarlenShape::from_lens(&lens, 4, 2, 128).unwrap();
            let s = BwdSchedule::new(&shape, &pads(&shape), causal, budget, up_tiles);
            assert_eq!(s.walks_up(), up_tiles > 0);
            // tiles 0, 1-2, 3-4, 5-6, 7-8, 9, 10-11, 12-13, 14-15, 16, 17-18, ..., 31-32, 33
            let mut own: Vec<i32> = s
                .pairs
                .iter()
                .flat_map(|&it| {
                    let (t, h) = (it / 4, it % 4);
                    let (lo, up) = (s.tiles[t as usize], s.tiles.get(t as usize + 1));
                    let paired = up.is_some_and(|u| u[0] == lo[0] && u[3] == lo[3] + 128);
                    std::iter::once(it).chain(paired.then_some((t + 1) * 4 + h))
                })
                .collect();
            own.sort();
            assert_eq!(own, (0..34 * 4).collect::<Vec<i32>>(), "every (tile, head) once");
            assert_eq!(s.pairs.len(), (1 + 5 + 1 + 3 + 9) * 4);
            for c in 0..s.chunks {
                let hc = 4 / s.chunks;
                assert!(s.pairs[s.pair_range(c)]
                    .iter()
                    .all(|&it| it as usize % 4 / hc == c));
            }
            for clusters in [1, 3, 66] {
                // every key tile that sees a query tile, ascending walking down, descending up
                for ((_, qt), order) in simulate_pairs(&s, 4, causal, clusters) {
                    let doc = s
                        .tiles
                        .iter()
                        .find(|t| {
                            qt >= t[4] as usize && qt < t[4] as usize + (t[1] as usize).div_ceil(BWD_QT)
                        })
                        .unwrap();
                    let q0 = (qt - doc[4] as usize) * BWD_QT;
                    let mut want: Vec<usize> = (0..(doc[1] as usize).div_ceil(BWD_KT))
                        .filter(|&k| !causal || k * BWD_KT < q0 + BWD_QT)
                        .collect();
                    if doc[7] != 0 {
                        want.reverse();
                    }
                    assert_eq!(
                        order, want,
                        "query tile {qt}, {clusters} clusters, up to {up_tiles} tiles up"
                    );
                }
            }
        }
    }

    #[test]
    fn documents_walking_up_take_their_key_tiles_highest_first_after_the_rest() {
        // key tiles: 1 + 8 + 2 + 5 + 17; up to 5 tiles walk up (causal only)
        let lens = [100, 1000, 129, 600, 2100];
        let shape = VarlenShape::from_lens(&lens, 2, 1, 128).unwrap();
        let s = BwdSchedule::new(&shape, &pads(&shape), true, Some(BWD_SCRATCH_BUDGET), 5);
        assert!(s.walks_up());
        let up: Vec<i32> = s.tiles.iter().map(|t| t[7]).collect();
        let want: Vec<i32> = [(1, 1), (8, 0), (2, 1), (5, 1), (17, 0)]
            .iter()
            .flat_map(|&(n, u)| std::iter::repeat_n(u, n))
            .collect();
        assert_eq!(up, want);
        // the 25 downward tiles first, longest first, the two heads of a tile adjacent; then the
        // 600-, 129- and 100-token documents, head 0's tiles highest first, then head 1's
        let down: Vec<usize> = s.items[..50]
            .iter()
            .step_by(2)
            .map(|&it| it as usize / 2)
            .collect();
        let costs: Vec<usize> = down
            .iter()
            .map(|&t| query_steps(s.tiles[t][1] as usize, s.tiles[t][3] as usize, true))
            .collect();
        assert!(costs.windows(2).all(|w| w[0] >= w[1]), "{costs:?}");
        assert!(down.iter().all(|&t| s.tiles[t][7] == 0));
        for c in s.items[..50].chunks(2) {
            assert_eq!((c[0] / 2, c[0] % 2, c[1] % 2), (c[1] / 2, 0, 1));
        }
        let up: Vec<(i32, i32)> = s.items[50..].iter().map(|&it| (it / 2, it % 2)).collect();
        let want: Vec<(i32, i32)> = [&[15, 14, 13, 12, 11][..], &[10, 9], &[0]]
            .iter()
            .flat_map(|doc| (0..2).flat_map(move |h| doc.iter().map(move |&t| (t, h))))
            .collect();
        assert_eq!(up, want);
        // never without the causal mask, nor with the knob at 0
        assert!(!BwdSchedule::new(&shape, &pads(&shape), false, Some(BWD_SCRATCH_BUDGET), 5).walks_up());
        assert!(!BwdSchedule::new(&shape, &pads(&shape), true, Some(BWD_SCRATCH_BUDGET), 0).walks_up());
    }

    #[test]
    fn walks_up_and_down_never_deadlock_and_add_each_query_tiles_partials_in_key_order() {
        // Each query tile's partials go in one fixed order, whatever the number of CTAs: key
        // tiles ascending where the document walks down, descending where it walks up; an item
        // only ever waits for items listed before it, so even one CTA finishes.
        let lens = [100, 1000, 129, 600, 2100, 64, 300];
        let shape = VarlenShape::from_lens(&lens, 4, 2, 128).unwrap();
        let cases = [(true, 0), (true, 5), (true, 100), (false, 5)];
        for ((causal, up_tiles), group) in cases.into_iter().flat_map(|c| [4, 2, 1].map(|g| (c, g))) {
            let budget = Some(BWD_SCRATCH_BUDGET);
            let s = BwdSchedule::grouped(&shape, &pads(&shape), causal, budget, up_tiles, group);
            // a GQA group's query heads (2 per KV head here) listed in ascending order per key
            // tile: the order the kernel sums their dK/dV partials in
            let mut last: std::collections::HashMap<(usize, usize), usize> = Default::default();
            for &it in &s.items {
                let (t, h) = (it as usize / 4, it as usize % 4);
                if let Some(prev) = last.insert((t, h / 2), h) {
                    assert!(prev < h, "tile {t}: head {h} listed after head {prev}");
                }
            }
            let first = simulate(&s, 4, causal, 1);
            for ctas in [2, 3, 7, 64] {
                assert_eq!(
                    simulate(&s, 4, causal, ctas),
                    first,
                    "{ctas} CTAs, up to {up_tiles} tiles up"
                );
            }
            // per (head, query tile): every key tile that sees it, once, in the walk's order
            let mut d0 = 0;
            let mut qt0 = 0;
            for &len in &lens {
                let nkt = len.div_ceil(BWD_KT);
                let up = causal && nkt <= up_tiles;
                for h in 0..4 {
                    for q in 0..len.div_ceil(BWD_QT) {
                        let seen = if causal { q * BWD_QT / BWD_KT + 1 } else { nkt };
                        let mut want: Vec<usize> = (0..seen).collect();
                        if up {
                            want.reverse();
                        }
                        assert_eq!(
                            first[&(h, qt0 + q)],
                            want,
                            "document at {d0}, head {h}, query tile {q}"
                        );
                    }
                }
                d0 += len;
                qt0 += len.div_ceil(BWD_QT);
            }
        }
    }

    #[test]
    fn follower_units_cover_each_chunks_heads_and_query_tiles_once_after_their_last_contributor() {
        // bwd_dq_follow's units (FLAMIA_BWD_FOLLOWERS): where every tile walks up, each chunk
        // lists every (head of the chunk, query tile) once, in the order of their documents'
        // tile-0 items (the last contributor: every other item of that document and head is
        // listed before it); mixed or non-causal plans have none.
        let lens = [100, 1000, 129, 600, 2100, 64, 300];
        let shape = VarlenShape::from_lens(&lens, 4, 2, 128).unwrap();
        for budget in [Some(BWD_SCRATCH_BUDGET), Some(0)] {
            let s = BwdSchedule::new(&shape, &pads(&shape), true, budget, 100);
            assert!(s.all_up());
            let units = s.dq_units(4);
            let (hc, nqt) = (s.chunk_heads(4), s.query_tiles);
            assert_eq!(units.len(), s.chunks * hc * nqt);
            for (c, chunk) in units.chunks(hc * nqt).enumerate() {
                let mut seen: Vec<i32> = chunk.to_vec();
                seen.sort_unstable();
                assert_eq!(seen, (0..(hc * nqt) as i32).collect::<Vec<_>>(), "chunk {c}");
                // in the order of the chunk's tile-0 items, each document's query tiles ascending
                let pos = |it: i32| s.items.iter().position(|&x| x == it).unwrap();
                let mut last = 0;
                for &u in chunk {
                    let (hl, qt) = (u as usize / nqt, u as usize % nqt);
                    let h = c * hc + hl;
                    let t = (0..s.tiles.len())
                        .find(|&t| {
                            s.tiles[t][3] == 0
                                && (s.tiles[t][4] as usize..).contains(&qt)
                                && qt < s.tiles[t][4] as usize + (s.tiles[t][1] as usize).div_ceil(BWD_QT)
                        })
                        .unwrap();
                    let p = pos((t * 4 + h) as i32);
                    assert!(p >= last, "chunk {c}: unit {u} out of the items' order");
                    last = p;
                    // every other key tile of that document and head listed before its tile 0
                    let n = (s.tiles[t][1] as usize).div_ceil(BWD_KT);
                    for k in t + 1..t + n {
                        assert!(pos((k * 4 + h) as i32) < p, "head {h}: key tile {k} after tile 0");
                    }
                }
            }
        }
        assert!(
            BwdSchedule::new(&shape, &pads(&shape), true, Some(BWD_SCRATCH_BUDGET), 5)
                .dq_units(4)
                .is_empty()
        );
        assert!(
            BwdSchedule::new(&shape, &pads(&shape), false, Some(BWD_SCRATCH_BUDGET), 100)
                .dq_units(4)
                .is_empty()
        );
    }

    #[test]
    fn backward_heads_split_into_whole_group_chunks_past_the_scratch_budget() {
        // 65,536 tokens x 16 heads x 128 x 4 B = 512 MiB of dQ accumulator: 2 chunks at 256 MiB,
        // 4 at 131,072 tokens; GQA adds 2 x 128 x 128 x 4 B per (key tile, KV head)
        assert_eq!(bwd_head_chunks(65536, 512, 16, 16, BWD_SCRATCH_BUDGET), 2);
        assert_eq!(bwd_head_chunks(131072, 1024, 16, 16, BWD_SCRATCH_BUDGET), 4);
        assert_eq!(bwd_head_chunks(4096, 32, 16, 16, BWD_SCRATCH_BUDGET), 1);
        assert_eq!(
            bwd_scratch_bytes(16384, 128, 16, 8, 2),
            16384 * 8 * 512 + 128 * 4 * 2 * 128 * 128 * 4
        );
        // a budget nothing fits: one chunk per KV group
        assert_eq!(bwd_head_chunks(1 << 20, 8192, 16, 4, 1), 4);
        let shape = VarlenShape::from_lens(&[100, 1000, 129, 256], 8, 4, 128).unwrap();
        let one = BwdSchedule::new(&shape, &pads(&shape), true, Some(usize::MAX), 0);
        let split = BwdSchedule::new(&shape, &pads(&shape), true, Some(1), 0);
        assert_eq!((one.chunks, split.chunks), (1, 4));
        let hc = split.chunk_heads(8);
        assert_eq!(hc, 2);
        let mut all = split.items.clone();
        all.sort();
        assert_eq!(all, (0..13 * 8).collect::<Vec<i32>>());
        for c in 0..split.chunks {
            let items = &split.items[split.chunk_range(c)];
            assert!(
                items.iter().all(|&it| it as usize % 8 / hc == c),
                "chunk {c}: {items:?}"
            );
            // the chunk keeps the one-chunk order (longest first, key tiles ascending per head)
            let kept: Vec<i32> = one
                .items
                .iter()
                .copied()
                .filter(|it| *it as usize % 8 / hc == c)
                .collect();
            assert_eq!(items, &kept[..]);
        }
    }

    #[test]
    fn rows_of_documents_that_all_walk_up_take_the_larger_budget() {
        // 65,536 tokens, 16 heads: 512 MiB of dQ accumulator. Every document walking up (at
        // most BWD_UP_TILES = 128 key tiles, causal): one launch; a longer document, or no
        // causal mask (nothing walks up), or an explicit budget: two
        let chunks = |lens: &[usize], causal: bool, budget: Option<usize>| {
            let shape = VarlenShape::from_lens(lens, 16, 16, 128).unwrap();
            BwdSchedule::new(&shape, &pads(&shape), causal, budget, BWD_UP_TILES).chunks
        };
        assert_eq!(chunks(&[256; 256], true, None), 1);
        assert_eq!(chunks(&[8192; 8], true, None), 1);
        assert_eq!(chunks(&[16384; 4], true, None), 1);
        assert_eq!(chunks(&[32768; 2], true, None), 2);
        let mut mixed = vec![256; 128];
        mixed.push(32768);
        assert_eq!(chunks(&mixed, true, None), 2);
        assert_eq!(chunks(&[256; 256], false, None), 2);
        assert_eq!(chunks(&[256; 256], true, Some(BWD_SCRATCH_BUDGET)), 2);
        // 131,072 tokens of short documents: 1 GiB, two launches of 512 MiB
        assert_eq!(chunks(&[1024; 128], true, None), 2);
    }
}
