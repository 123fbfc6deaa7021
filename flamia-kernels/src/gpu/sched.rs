//! Work lists of the persistent kernels (`cuda/sched.cuh`), built once per packing on the host.
//!
//! The v4 forward's unit of work is one 128-token query tile of one document for one query head.
//! Its cost is the number of 128-key tiles it visits (causal: tile i of a document visits i + 1;
//! otherwise every tile of the document). Items are sorted by descending cost, and the heads of
//! one tile are adjacent, so the CTAs in flight at any time stream the same few heads' K/V
//! (shared in L2) while a CTA that runs out of work takes the next longest item from the
//! kernel's atomic counter: the long documents' tiles start first and the short ones fill the
//! tail.

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
        let hq = shape.heads_q;
        let mut order: Vec<usize> = (0..tiles.len()).collect();
        order.sort_by_key(|&t| (std::cmp::Reverse(cost[t]), t));
        let items = order
            .iter()
            .flat_map(|&t| (0..hq).map(move |h| (t * hq + h) as i32))
            .collect();
        FwdSchedule { tiles, items }
    }

    /// Key tiles visited by item `i` (the cost it was sorted by).
    pub fn item_cost(&self, i: usize, heads_q: usize, causal: bool) -> usize {
        let t = self.tiles[self.items[i] as usize / heads_q];
        let (len, q0) = (t[1] as usize, t[3] as usize);
        key_tiles(len, q0, causal)
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
}
