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
//! The v4 backward's unit of work is one 128-key tile of one document for one query head; its cost
//! is the number of 64-query steps it walks (causal: from the tile to the document end). Items are
//! sorted by descending cost with ties in document and tile order, the query heads of one tile
//! adjacent and ascending: within a document the key tiles are then taken in ascending order, the
//! order in which the kernel's semaphores let each query tile's dQ partials in (an item only ever
//! waits for items taken before it, so the ordered reduction cannot deadlock), and the heads of a
//! GQA group are taken in the order their dK/dV partials are summed.

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

/// Work items `tile * heads + head` ordered by descending `cost[tile]`, ties in tile order, the
/// heads of one tile adjacent and ascending.
fn longest_first(cost: &[usize], heads: usize) -> Vec<i32> {
    let mut order: Vec<usize> = (0..cost.len()).collect();
    order.sort_by_key(|&t| (std::cmp::Reverse(cost[t]), t));
    order
        .iter()
        .flat_map(|&t| (0..heads).map(move |h| (t * heads + h) as i32))
        .collect()
}

/// The v4 forward's work list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FwdSchedule {
    /// `{doc start, doc length, padded doc start, tile offset in doc}` per 128-token query tile,
    /// in document order.
    pub tiles: Vec<[i32; 4]>,
    /// `tile * heads_q + head`, longest first.
    pub items: Vec<i32>,
}

impl FwdSchedule {
    /// Tiles and items of `shape`; `pad_starts` are the documents' starts in the dim-major
    /// copies (the plan's padded layout).
    pub fn new(shape: &VarlenShape, pad_starts: &[usize], causal: bool) -> Self {
        let mut tiles = Vec::new();
        let mut cost = Vec::new();
        for (d, w) in shape.cu_seqlens.windows(2).enumerate() {
            let (s, len) = (w[0], w[1] - w[0]);
            for q0 in (0..len).step_by(FWD_QT) {
                tiles.push([s as i32, len as i32, pad_starts[d] as i32, q0 as i32]);
                cost.push(key_tiles(len, q0, causal));
            }
        }
        let items = longest_first(&cost, shape.heads_q);
        FwdSchedule { tiles, items }
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

/// The v4 backward's work list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BwdSchedule {
    /// Per 128-key tile, in document order: `{doc start, doc length, padded doc start, tile
    /// offset in doc, the document's first 64-query tile (global index), this key tile's global
    /// index, 0, 0}` (`struct BwdTile`).
    pub tiles: Vec<[i32; 8]>,
    /// `tile * heads_q + head`, longest first.
    pub items: Vec<i32>,
    /// 64-query tiles over all documents (the dQ semaphores per head).
    pub query_tiles: usize,
}

impl BwdSchedule {
    /// Tiles and items of `shape` (`pad_starts` as for [`FwdSchedule::new`]).
    pub fn new(shape: &VarlenShape, pad_starts: &[usize], causal: bool) -> Self {
        let mut tiles = Vec::new();
        let mut cost = Vec::new();
        let mut qt0 = 0usize;
        for (d, w) in shape.cu_seqlens.windows(2).enumerate() {
            let (s, len) = (w[0], w[1] - w[0]);
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
                    0,
                ]);
                cost.push(query_steps(len, k0, causal));
            }
            qt0 += len.div_ceil(BWD_QT);
        }
        let items = longest_first(&cost, shape.heads_q);
        BwdSchedule {
            tiles,
            items,
            query_tiles: qt0,
        }
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
            let s = BwdSchedule::new(&shape, &pads(&shape), causal);
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
        let s = BwdSchedule::new(&shape, &pads(&shape), true);
        assert_eq!(s.tiles[1], [100, 1000, 128, 0, 2, 1, 0, 0]);
    }
}
