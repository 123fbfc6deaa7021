//! Work plan of one packed batch: the tables the kernels index by block id, built on the host
//! from `cu_seqlens` and uploaded once per batch.
//!
//! - 32-token quantiser blocks: `int4 {doc start, doc length, padded doc start, block offset}`.
//! - 64-token attention tiles (query tiles of the forward and dQ kernels, key tiles of the dK/dV
//!   kernel): the same `int4`, ordered by decreasing causal cost so the long tiles start first.
//! - Padded token count `Tpad`: every document starts at a multiple of 64 in the dim-major code
//!   copies (`[heads, head_dim, Tpad]`), so every 64-token tile there is 16-byte aligned and
//!   ends inside its document's zero-padded span; `Tpad` is a multiple of 128.
//! - Quantiser chunks (the quantiser's items, `cuda/quant.cu`): one `int4` per 128-position
//!   chunk of the padded layout, the quantiser blocks at its four 32-position slots (-1: none),
//!   so the quantiser writes each dim-major row a full 128-byte line at a time.

use super::buffer::DeviceBuf;
use super::error::GpuResult;
use super::runtime::Gpu;
use super::sched::{bwd_scratch_budget, bwd_up_tiles, BwdSchedule, FwdSchedule};
use crate::options::VarlenShape;

/// Tokens per quantiser block (the MXFP8 token block).
pub const QBLOCK: usize = 32;
/// Tokens per attention tile.
pub const TILE: usize = 64;
/// Padded positions per quantiser chunk: one 128-byte line of a dim-major row (session 15:
/// Q/K/V quantiser 0.67 -> 0.50 ms at d = 128 against one 32-byte sector per block and row,
/// docs/perf.md).
pub const QCHUNK: usize = 128;

/// Host-side tables of a packing (no GPU needed; unit-tested on the CPU).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlanTables {
    pub blocks: Vec<[i32; 4]>,
    pub tiles: Vec<[i32; 4]>,
    pub tpad: usize,
    /// Quantiser chunks: per 128 padded positions,
    /// the index into `blocks` of the block at each 32-position slot, -1 where none lies (a
    /// document's 32-token tail, the layout's last 64 positions). Slot 0 always holds one.
    pub chunks: Vec<[i32; 4]>,
    /// The token at each padded position (`tpad` entries; -1 for a document's padding): the v4
    /// backward's dQ conversion from its padded-row accumulator.
    pub pad_tok: Vec<i32>,
    /// The v4 forward's 128-token query tiles and longest-first work items ([`FwdSchedule`]).
    pub fwd: FwdSchedule,
    /// The v4 backward's 128-key tiles and longest-first work items ([`BwdSchedule`]).
    pub bwd: BwdSchedule,
}

impl PlanTables {
    /// Builds the tables; `causal` orders tiles by the key (or query) tiles they visit; the work
    /// lists' head groups are chosen for an H100/H200's 132 SMs ([`PlanTables::for_ctas`]).
    pub fn new(shape: &VarlenShape, causal: bool) -> Self {
        Self::for_ctas(shape, causal, 132)
    }

    /// [`PlanTables::new`] for persistent kernels of `ctas` CTAs (the GPU's SMs).
    pub fn for_ctas(shape: &VarlenShape, causal: bool, ctas: usize) -> Self {
        let mut blocks = Vec::new();
        let mut tiles = Vec::new();
        let mut pad = 0usize;
        let mut pad_starts = Vec::with_capacity(shape.docs());
        for d in shape.cu_seqlens.windows(2) {
            let (s, len) = (d[0], d[1] - d[0]);
            pad_starts.push(pad);
            for b in (0..len).step_by(QBLOCK) {
                blocks.push([s as i32, len as i32, pad as i32, b as i32]);
            }
            for t in (0..len).step_by(TILE) {
                tiles.push([s as i32, len as i32, pad as i32, t as i32]);
            }
            pad += len.div_ceil(TILE) * TILE;
        }
        // Cost of a tile: query tile t of a causal doc visits t/64 + 1 key tiles; a key tile
        // visits the rest. Descending by the larger of the two keeps both kernels balanced enough.
        let cost = |x: &[i32; 4]| -> i64 {
            let n = (x[1] as i64 + TILE as i64 - 1) / TILE as i64;
            let i = x[3] as i64 / TILE as i64;
            if causal {
                (i + 1).max(n - i)
            } else {
                n
            }
        };
        tiles.sort_by_key(|x| std::cmp::Reverse(cost(x)));
        let tpad = pad.next_multiple_of(QCHUNK).max(QCHUNK);
        let mut chunk_tab = vec![[-1i32; 4]; tpad / QCHUNK];
        for (i, b) in blocks.iter().enumerate() {
            let pos = (b[2] + b[3]) as usize;
            chunk_tab[pos / QCHUNK][pos % QCHUNK / QBLOCK] = i as i32;
        }
        // the kernel starts every chunk item at slot 0 (documents start on 64-position segments
        // whose first 32 positions are a block; a chunk starts a segment, and `Tpad` adds at most
        // one 64-position segment past the last document, at a chunk's slots 2 and 3)
        debug_assert!(chunk_tab.iter().all(|c| c[0] >= 0));
        let mut pad_tok = vec![-1i32; tpad];
        for (d, w) in shape.cu_seqlens.windows(2).enumerate() {
            for (i, slot) in pad_tok[pad_starts[d]..pad_starts[d] + (w[1] - w[0])]
                .iter_mut()
                .enumerate()
            {
                *slot = (w[0] + i) as i32;
            }
        }
        PlanTables {
            blocks,
            tiles,
            tpad,
            chunks: chunk_tab,
            pad_tok,
            fwd: FwdSchedule::for_ctas(shape, &pad_starts, causal, ctas),
            bwd: BwdSchedule::with_head_groups(
                shape,
                &pad_starts,
                causal,
                bwd_scratch_budget(),
                bwd_up_tiles(),
                ctas,
            ),
        }
    }
}

/// The uploaded plan of one packing.
pub struct Plan {
    pub(crate) shape: VarlenShape,
    pub(crate) causal: bool,
    pub(crate) tables: PlanTables,
    pub(crate) blocks: DeviceBuf<i32>,
    /// [`PlanTables::chunks`] (one unused entry when there are none).
    pub(crate) chunks: DeviceBuf<i32>,
    pub(crate) tiles: DeviceBuf<i32>,
    /// v4 forward: 128-token query tiles, work items, and the work counter the v4 kernels' CTAs
    /// take items from (two words, the claims and the CTAs done; each launch leaves them zero),
    /// then the E4M3 quantiser's pair (`QUANT_DYN`: [`Plan::quant_counter`]).
    pub(crate) fwd_tiles: DeviceBuf<i32>,
    pub(crate) fwd_items: DeviceBuf<i32>,
    pub(crate) counter: DeviceBuf<i32>,
    /// v4 backward: 128-key tiles and work items; `cu_seqlens` as i32 (the dV fold kernel).
    pub(crate) bwd_tiles: DeviceBuf<i32>,
    pub(crate) bwd_items: DeviceBuf<i32>,
    /// [`BwdSchedule::pairs`] (one unused entry when there are none).
    pub(crate) bwd_pairs: DeviceBuf<i32>,
    pub(crate) cu: DeviceBuf<i32>,
    /// [`PlanTables::pad_tok`].
    pub(crate) pad_tok: DeviceBuf<i32>,
    /// [`super::sched::BwdSchedule::dq_units`] (`bwd_dq_follow`'s; one unused entry when there
    /// are none).
    pub(crate) dq_units: DeviceBuf<i32>,
}

impl std::fmt::Debug for Plan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Plan({} tokens, {} docs, {} blocks, {} tiles)",
            self.shape.tokens(),
            self.shape.docs(),
            self.tables.blocks.len(),
            self.tables.tiles.len()
        )
    }
}

/// Head dims the GPU kernels are built for (the `HEAD_DIM` define of every module): the v4
/// attention kernels (also the `row_ds_exponents` backward) and the E4M3 quantiser take both; the
/// v3.1 kernels (NVFP4 scores, the FP32-promotion and `v3` switches) 128 only, which
/// [`super::check_head_dim`] checks.
pub const GPU_HEAD_DIMS: [usize; 2] = [64, 128];

impl Plan {
    /// Validates `shape` (head dim 64 or 128 on the GPU: [`GPU_HEAD_DIMS`]) and uploads its tables.
    pub fn new(gpu: &Gpu, shape: &VarlenShape, causal: bool) -> GpuResult<Plan> {
        shape.validate()?;
        if !GPU_HEAD_DIMS.contains(&shape.head_dim) {
            return Err(super::error::GpuError::NotSupported(format!(
                "head_dim {} on the GPU; the kernels are built for head_dim {:?}",
                shape.head_dim, GPU_HEAD_DIMS
            )));
        }
        if shape.tokens() >= i32::MAX as usize / 256 {
            return Err(super::error::GpuError::NotSupported(format!(
                "{} tokens in one call; at most {}",
                shape.tokens(),
                i32::MAX as usize / 256 - 1
            )));
        }
        let tables = PlanTables::for_ctas(shape, causal, gpu.sm_count().max(1) as usize);
        let flat = |v: &[[i32; 4]]| v.iter().flatten().copied().collect::<Vec<i32>>();
        let blocks = DeviceBuf::from_host(gpu, &flat(&tables.blocks))?;
        let chunks = DeviceBuf::from_host(gpu, &flat(&tables.chunks))?;
        let tiles = DeviceBuf::from_host(gpu, &flat(&tables.tiles))?;
        let fwd_tiles = DeviceBuf::from_host(gpu, &flat(&tables.fwd.tiles))?;
        let fwd_items = DeviceBuf::from_host(gpu, &tables.fwd.items)?;
        let counter = DeviceBuf::zeros(gpu, 4)?;
        let bwd_tiles = DeviceBuf::from_host(
            gpu,
            &tables.bwd.tiles.iter().flatten().copied().collect::<Vec<i32>>(),
        )?;
        let bwd_items = DeviceBuf::from_host(gpu, &tables.bwd.items)?;
        let bwd_pairs = DeviceBuf::from_host(gpu, &tables.bwd.pairs)?;
        let cu = DeviceBuf::from_host(
            gpu,
            &shape.cu_seqlens.iter().map(|&x| x as i32).collect::<Vec<i32>>(),
        )?;
        let pad_tok = DeviceBuf::from_host(gpu, &tables.pad_tok)?;
        let dq_units = DeviceBuf::from_host(gpu, &tables.bwd.dq_units(shape.heads_q))?;
        Ok(Plan {
            shape: shape.clone(),
            causal,
            tables,
            blocks,
            chunks,
            tiles,
            fwd_tiles,
            fwd_items,
            counter,
            bwd_tiles,
            bwd_items,
            bwd_pairs,
            cu,
            pad_tok,
            dq_units,
        })
    }

    /// The packing this plan was built for.
    pub fn shape(&self) -> &VarlenShape {
        &self.shape
    }

    /// Device address of the E4M3 quantiser's claim counter (words 2 and 3 of the work counter;
    /// `QUANT_DYN`: the quantiser's CTAs take chunk items from it, and its last CTA zeroes it).
    pub(crate) fn quant_counter(&self) -> u64 {
        self.counter.ptr() + 2 * std::mem::size_of::<i32>() as u64
    }

    /// Tokens of the dim-major copies, padding included.
    pub fn tpad(&self) -> usize {
        self.tables.tpad
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiser_chunks_hold_every_block_once_at_its_position() {
        for lens in [
            &[1usize][..],
            &[1, 33, 64, 129],
            &[31, 32, 33, 127, 129, 4095],
            &[64, 64, 65],
        ] {
            let shape = VarlenShape::from_lens(lens, 2, 1, 128).unwrap();
            let on = PlanTables::new(&shape, true);
            let pad: usize = lens.iter().map(|l| l.div_ceil(TILE) * TILE).sum();
            assert_eq!(on.tpad, pad.next_multiple_of(QCHUNK), "{lens:?}");
            assert_eq!(on.chunks.len() * QCHUNK, on.tpad, "{lens:?}");
            // each block at the slot of its padded position, once; -1 elsewhere
            let mut seen = vec![0; on.blocks.len()];
            for (c, ch) in on.chunks.iter().enumerate() {
                assert!(ch[0] >= 0, "{lens:?}: chunk {c} has no block at slot 0");
                for (j, &b) in ch.iter().enumerate() {
                    if b >= 0 {
                        let e = on.blocks[b as usize];
                        assert_eq!(
                            (e[2] + e[3]) as usize,
                            c * QCHUNK + j * QBLOCK,
                            "{lens:?}: block {b}"
                        );
                        seen[b as usize] += 1;
                    }
                }
            }
            assert!(
                seen.iter().all(|&n| n == 1),
                "{lens:?}: every block once: {seen:?}"
            );
            // a slot without a block is a document's 32-token tail or past the last document
            let empty = on.chunks.iter().flatten().filter(|&&b| b < 0).count();
            let tails = lens.iter().filter(|&&l| l.div_ceil(QBLOCK) % 2 == 1).count();
            assert_eq!(empty, tails + (on.tpad - pad) / QBLOCK, "{lens:?}");
        }
    }

    #[test]
    fn blocks_and_tiles_restart_at_every_document() {
        let shape = VarlenShape::from_lens(&[1, 33, 64, 129], 2, 1, 128).unwrap();
        let t = PlanTables::new(&shape, true);
        assert_eq!(t.blocks.len(), 1 + 2 + 2 + 5);
        assert_eq!(t.blocks[1], [1, 33, 64, 0]);
        assert_eq!(t.blocks[2], [1, 33, 64, 32]);
        assert_eq!(t.tiles.len(), 1 + 1 + 1 + 3);
        // padded starts: 0, 64, 128, 192; total 192 + 192
        assert_eq!(t.tpad, 384);
        assert!(t.tiles.contains(&[98, 129, 192, 128]));
        for b in &t.blocks {
            assert_eq!(b[2] % 64, 0);
            assert!(b[3] < b[1]);
        }
        // every token once at its padded position, the padding -1
        assert_eq!(t.pad_tok.len(), 384);
        assert_eq!(t.pad_tok[0], 0);
        assert!(t.pad_tok[1..64].iter().all(|&x| x == -1));
        assert_eq!(t.pad_tok[64..97], (1..34).collect::<Vec<i32>>()[..]);
        assert!(t.pad_tok[97..128].iter().all(|&x| x == -1));
        assert_eq!(t.pad_tok[192 + 128], 98 + 128);
        let mut seen: Vec<i32> = t.pad_tok.iter().copied().filter(|&x| x >= 0).collect();
        seen.sort_unstable();
        assert_eq!(seen, (0..227).collect::<Vec<i32>>());
    }

    #[test]
    fn tiles_are_ordered_by_decreasing_cost() {
        let shape = VarlenShape::from_lens(&[64, 640], 1, 1, 128).unwrap();
        let t = PlanTables::new(&shape, true);
        assert_eq!(t.tiles.len(), 11);
        // first: the 640 doc's first or last tile (10 key tiles either way)
        assert_eq!(t.tiles[0][1], 640);
        assert_eq!(*t.tiles.last().unwrap(), [0, 64, 0, 0]);
    }
}
