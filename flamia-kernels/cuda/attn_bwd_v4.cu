// FLAMIA attention backward v4 (Hopper, E4M3 operands: mxfp8 and leaky-fp8, dS exponents per
// 32x32 block): ONE kernel per (128-key tile, query head), warp-specialised and persistent, with a
// deterministic dQ. docs/kernels.md "Backward v4" has the design and its arithmetic.
//
// CTA = 384 threads, one per SM, for the whole launch:
//   warpgroup 0, warp 0   producer: takes work items (longest first, sched.cuh), TMA-loads per
//                         step a 64-query tile of Q, dO (token-major) and Q, dO (dim-major,
//                         64-byte swizzle) into a BWD_STAGES-deep ring, with the step's per-query
//                         constants (scales, LSE, D) computed on the way, and per item its K, V
//                         (token-major) and K (dim-major: BWD_KD_XPOSE 0) tiles and per-key
//                         factors. Items are pipelined: the next item's first stage goes out while
//                         this item runs, its K and V once this item's last step has read K and V
//                         (kv_empty), its dim-major K once this item's last dQ has read that
//                         (kd_empty), so the loads overlap the item's last dQ and its end. With
//                         BWD_KD_XPOSE 2 (the host's choice for short and mid-length documents)
//                         the consumers make the dim-major K tile from the token-major one at the
//                         item's start instead, and with BWD_VT_XPOSE (the same plans) the
//                         K/V slot gets V's dim-major copy, which the consumers transpose into
//                         the token-major tile in place. Registers cut to 24.
//   warpgroup 0, warps 1-2  dQ reducers (lane 0, one per consumer warpgroup): take the step's FP32
//                         dQ partial out of shared memory in order (below), so the consumers never
//                         wait on another CTA's progress, only for their partial buffer.
//   warpgroups 1, 2       consumers: warpgroup c owns keys 64c..64c+63 of the tile (rows of S^T),
//                         accumulates their dK and dV in registers for the whole item (240 regs).
// Per step (64 queries, walked from the document end down to the diagonal) warpgroup c computes
//   S^T  = K_c Q^T, dP^T = V_c dO^T           SS wgmma m64n64k32 x HEAD_DIM/32 each, issued together
//   P, dS (one FFMA + one ex2 per score for x, the masks only on the two diagonal steps)
//   dS~ = dS * 2^(eQ_i + eK_j) quantised per 32x32 block (exponents through a 64-thread barrier)
//   dV  += P~^T dO                             RS m64n{HEAD_DIM}k32 x 2 (P~ = P 2^(edO_i - c_j) in E4M3)
//   dK  += sum_s 2^e(s) (codes_s^T Q_s)        RS m64n{HEAD_DIM}k32, one fresh product per 32-query slice
//   dS codes -> shared memory, transposed      (the A operand of dQ, both warpgroups' halves)
//   dQ_c = sum_s 2^e(s) (codes_s K_s)          SS m64n{HEAD_DIM/2}k32 per 32-key slice, this
//                                              warpgroup's half of the dims,
//                                              two slices in flight (two 32-register accumulators)
//   dQ_c -> shared memory -> the reducer warp: TMA reduce-add (FP32) into dq_acc, after this
//   (query tile, head)'s semaphore says every earlier key tile has added its part: a fixed order,
//   bitwise repeatable.
// The item's end: dK = 2^-eK scale dK (Hadamard back), dV = 2^c dV, BF16. GQA: the query heads of a
// group are separate items; their dK/dV partials meet in dkv_acc in head order (semaphore per key
// tile and KV head), and the group's last head writes the BF16 result.
// Afterwards bwd_dq_convert turns dq_acc into BF16 dQ (2^-eQ scale, Hadamard back).
// dV's fold c_j = max(edO over the rows that see key j) - 8 comes from bwd_dv_fold (run before).
#include "attn_common.cuh"
#include "tma.cuh"
#include "sched.cuh"
#include "xpose.cuh"

#ifndef BWD_STAGES
#define BWD_STAGES 3  // the host's default (src/gpu/attention.rs backward_v4_stages)
#endif
#ifndef BWD_DQ_BUFS
#define BWD_DQ_BUFS 1  // dQ partial buffers per consumer warpgroup (2: the reducer may lag a step)
#endif
#ifndef BWD_DEFER_DQ
#define BWD_DEFER_DQ 1  // a step's dQ runs after the next step's S..dK (the warpgroups need not meet)
#endif
#define BWD_DS_BUFS (BWD_DEFER_DQ ? 4 : 2)  // dS code tiles in flight
// BWD_ROW_DS 1 (the `row_ds_exponents` option): two dS copies, each with exponents per row of its
// product x 32 columns (reference/bwd.rs): dQ's per (query, 32-key block), dK's per (key,
// 32-query slice). 0: one copy, exponents per 32x32 block.
#ifndef BWD_ROW_DS
#define BWD_ROW_DS 0
#endif
// BWD_KEY_BLOCKS 1 (the host sets it unless per-token scales): K's, V's and the dV fold's
// exponents are uniform per aligned 32-key block, so each consumer thread's key factors are one
// value per step (`bwd_step`).
#ifndef BWD_KEY_BLOCKS
#define BWD_KEY_BLOCKS 0
#endif
// BWD_EARLY_COLS n (0..8): the first n of P's 8 column-constant loads (float4 each) and the key
// factors are issued before the wait for S^T, the rest inside P's loop. Measured (session 10,
// 1x65536 backward, same call): all 8 early, d = 64 70.8 vs 73.4 ms; d = 128 94.4 / 94.6 vs
// 93.2 / 93.2 ms (ptxas schedules the d = 128 step worse), so 8 at d = 64 and none at d = 128.
// Session 16 (ncu of the d = 128 step at 1x65536: the first FMUL of P waited ~210 clocks for its
// LDS, queued behind the S^T / dP^T products' shared-memory reads of both warpgroups; the
// column-constant loads are 22% of the kernel's shared-memory wavefronts): all 8 early and first
// at d = 128 measured -2.2% backward at 1x65536, -1.7% at 4x16384, but +1.1..+3.5% on the
// shorter documents, whose launches build the upward walk (BWD_WALK_UP), where ptxas then spills
// 8 instead of 3 registers per step. Session 17: 6 early (and first) in the walk-up build keep
// its spills: backward -1.3..-2.8% from 8x8192 to 64x1024, training call -1.1..-1.6% on the
// mid lengths (+2.1% backward at 256x256, training call 0.0%); with BWD_CVT4 1,237 -> 1,198 SASS
// per interior step.
#ifndef BWD_EARLY_COLS
#define BWD_EARLY_COLS (HEAD_DIM == 64 || !BWD_WALK_UP ? 8 : 6)
#endif
// BWD_COLS_FIRST 1: those early loads are issued right after the stage's wait, before S^T's and
// dP^T's products (0: after them). Measured (session 11, backward ms, same call, median of 2):
// d = 64 -1.0% at 1x65536, -1.2% 8x8192 (alone); d = 128 (4 or 8 early) +0.4-0.9%: d = 64 only;
// since sessions 16 / 17 at d = 128 too (with 8 / 6 early, above).
#ifndef BWD_COLS_FIRST
#define BWD_COLS_FIRST 1
#endif
// BWD_DV_EARLY 1: dV's product is issued right after P~'s A fragments and waited for after the
// dS block maxima and codes (0: issued and waited for after them). Measured at d = 64 (session
// 11, same call): alone -2.5% at 1x65536; with BWD_COLS_FIRST -2.7% 1x65536, -1.7% 8x8192, -2.0%
// 64x1024, -4.4% 256x256, -2.3% lognormal. d = 64 only (session 8's m64n64 dV pieces under the
// maxima at d = 128 were 1-2% slower).
#ifndef BWD_DV_EARLY
#define BWD_DV_EARLY (HEAD_DIM == 64)
#endif
// BWD_REDUX 1 (session 17, the default; the host builds 0 for FLAMIA_BWD_REDUX=0): the dS block
// maxima's warp reduction as one redux.sync.max.u32 on the bits of the thread's maximum (>= +0,
// never NaN: bitwise fmaxf's result) instead of five shuffles and five FMNMX, and the thread's 16
// values per slice as a tree (depth 4) instead of a chain of 16: shorter dependent chains before
// the 64-thread barrier.
// 1,204 -> 1,186 SASS per interior step at d = 128, 907 -> 891 at 64. Measured (same call, two
// rounds): backward -0.4..-2.0% on seven d = 128 workloads (8192+224x256 +0.1%, 256x256 -4.7%),
// training call -0.6..-2.0% on eight (64x1024 +1.5%, its backward -1.1%); d = 64 -3.0 / -3.0 /
// -2.6 / -0.1% (1x65536, 16x4096, 64x1024, 256x256). FLAMIA_BWD_REDUX=0 keeps the shuffles (A/B
// and the bitwise test). Session 17 also measured the two consumer warpgroups taking turns to
// issue S^T / dP^T (named barriers around the products): training call +0.2..+3.5% on seven
// workloads, with REDUX +0.5..+1.5% on four: removed (docs/perf.md "Session 17").
#ifndef BWD_REDUX
#define BWD_REDUX 1
#endif
// BWD_SKIP_DEAD 1: a step whose warpgroup keys see none of its queries (causal: the second
// warpgroup's step at the tile's first query tile, its keys all after those queries; any mask:
// no key of the warpgroup in the document) runs `bwd_step_dead` (zero codes, no products)
// instead of a masked step; the results are bitwise the same (GPU test
// `dead_steps_skipped_give_bitwise_the_full_backward`, host knob FLAMIA_BWD_SKIP_DEAD). Such
// steps are 1 of a tile's n for the second warpgroup: 1 in 9 on 1,024-token documents. At d = 128
// the extra loop costs the interior loop 3 spilled dV registers (ptxas, session 10): on long
// documents that may cost more than it saves; both are A/B variants (branches bwd-skipdead*).
#ifndef BWD_SKIP_DEAD
#define BWD_SKIP_DEAD 0
#endif
// BWD_BLOCK_EXP_NN 1: the dS block exponents by e4m3_scale_exp_nn (attn_common.cuh: three
// instructions, the maxima never NaN) instead of e4m3_scale_exp; the same values (bitwise the same
// results either way). Census (session 37): 12 SASS fewer per interior step. Measured (session 38,
// same calls, two rounds each, against session 36's sources): at d = 128 the backward SLOWER,
// 1x65536 77.2 / 76.9 ms against 74.4 / 74.3 (4x16384 19.96 / 19.85 against 19.23 / 19.76); at
// d = 64 faster, 1x65536 59.21 / 59.24 against 59.53 / 59.49, 16x4096 3.896 / 3.897 against
// 3.987 / 4.012. The default follows the measurements: d = 64 only.
#ifndef BWD_BLOCK_EXP_NN
#define BWD_BLOCK_EXP_NN (HEAD_DIM == 64)
#endif
// BWD_STRESS 1 (test builds: the host's FLAMIA_BWD_JITTER): with a nonzero P.jitter each consumer
// warp also waits a pseudo-random few microseconds between taking its dQ buffer and storing its
// partial, so a buffer released before the stores have landed is read early by the reducer's TMA
// and the jitter test sees other bits (the release's ordering is otherwise hidden by timing: the
// partial stores beat the reducer's TMA even when they follow the arrival, session 10).
#ifndef BWD_STRESS
#define BWD_STRESS 0
#endif
// BWD_WALK_UP 1 (the host sets it when its plan flags any tile: FLAMIA_BWD_UP_TILES,
// src/gpu/sched.rs): a tile whose BwdTile.up is set (causal, in a document of at most that many
// key tiles) walks its query tiles from the diagonal up, and each such query tile takes its dQ
// partials in descending key-tile order (the highest key tile that sees it first). The host lists
// such a document's key tiles highest first, so they run together, each two steps ahead of the
// next lower one: they read the same Q/dO stages and dQ rows from L2 one after the other instead
// of queueing on the semaphores, as the downward walk makes them (all of a document's key tiles
// start on its last query tile; session 6: grouping documents that way cut DRAM reads 2.71 ->
// 0.82 GB at 64x1024 but the queueing made the kernel slower). 0: every tile walks down, key
// tiles ascending. The host sets it where its list has such tiles (sched.rs, BWD_UP_TILES: by
// default documents of at most 8,192 tokens); with BWD_LATE_CLAIM (session 12) the walk cut the
// backward 17-22% at 16x4096 .. 64x1024 (ncu at 16x4096: DRAM reads 9.40 -> 0.80 GB, L2 hit rate
// 38 -> 93%).
#ifndef BWD_WALK_UP
#define BWD_WALK_UP 0
#endif
// BWD_LATE_CLAIM 1: the producer claims its CTA's next item from the counter after issuing the
// current item's last stage (about BWD_STAGES steps before the item ends) instead of at its
// start. Claimed at the start, an item starts when the claiming CTA's current item ends, so the
// items start in another order than the list's: a key tile can start before the one whose dQ
// partials it must follow and wait on the semaphores at every query tile. A model of the schedule
// (session 11: CTAs, one step per tick, the semaphore turns, one dQ buffer, claims at the start)
// gives the upward walk 1.6-2.0x the time of the downward one at 8x8192 .. 64x1024, as measured
// (1.8-2.1x), and claimed late 1.01-1.02x; for the downward walk it predicts 2% off 1x65536 and
// nothing on shorter documents. Measured (session 12, d = 128, walking down): -0.9% 1x65536,
// -0.4 .. -2.2% elsewhere, -5.4% 8192+224x256; with the upward walk it is what makes the walk pay
// (claimed at the start the walk's consumers waited on the dQ buffer 4x longer than they ran).
// 0: the claim at the item's start (kept for A/B).
#ifndef BWD_LATE_CLAIM
#define BWD_LATE_CLAIM 1
#endif
// BWD_PRODUCER_FOLD 1 (with BWD_KEY_BLOCKS; BWD_FOLD below): the producer warp writes each
// stage's column constants already folded with each 32-key block's factors (qf 2^eK, dq 2^(eV+eK),
// nd 2^eK, pe 2^-c; nl unfolded), one slot per block of the tile plus a slot with factors 0 for
// the key rows past the document, and each consumer thread reads its block's slot instead of
// multiplying its 16 column constants by its key factors every step (64 FMUL per thread per
// step, repeated by all 256 consumer threads; the producer does 40 per lane per stage). The
// products are the consumers' own (the same operands, one rounding each, vk = vf kf first), so
// every value of the step is bitwise that of the per-thread fold (see bwd_step). Shared memory:
// per stage 5 slots x 32 column pairs x 40 bytes (qk and nl, A and B, pc) = 6.25 KB instead of
// 1.5 KB: +14.3 KB with 3 stages, which fits at d = 64 (host smem_bwd4 budgets it there, with
// block scales, whether the fold is on or not) but not at d = 128.
// Census (d = 64, block scales, kernel-regs.py --bwd-per-step): 1,037 -> 973 SASS per interior
// step and 1,119 -> 1,055 per masked step (FMUL 177 -> 112), 168 registers, the step loops
// spill-free; the producer's stage loop (24 registers) 171 -> 261 SASS, its spill loads 12 -> 18
// per stage (kernel total 204 / 276 -> 200 / 308 B spill stores / loads). At d = 128 it would need
// two stages. On by default at d = 64 with block scales since session 13 (measured with the late
// claim and the upward walk, docs/perf.md "Session 13"): backward -4.0% at 1x65536, -2.6..-4.5% at
// 4x16384 .. 32x2048, -1.7% at 64x1024, +4.9% at 256x256 (its items are one or two steps long: the
// producer's 40 folds per stage are not hidden there); session 12, walking down, it lost 12-16% at
// mid lengths.
#ifndef BWD_PRODUCER_FOLD
#define BWD_PRODUCER_FOLD (HEAD_DIM == 64 && BWD_KEY_BLOCKS)
#endif
#define BWD_FOLD (BWD_PRODUCER_FOLD && BWD_KEY_BLOCKS)
// BWD_KD_XPOSE: where the dQ products' B operand, K dim-major (row = dim, 128 keys, 128-byte
// swizzle), comes from. 0: TMA-loaded from the quantiser's dim-major copy (kd_full / kd_empty,
// after the previous item's last dQ has read sm.kd). (A mode 1, the producer warpgroup's idle
// warp transposing a second TMA of the token-major tile, measured +3..+7% backward at short and
// mid lengths in sessions 22-23 (one 24-register warp's serial ldmatrix -> stmatrix chain exposed
// at every item start) and was removed in session 24; commit 5614198 has it.)
// BWD_KD_XPOSE 2 (the host's choice since session 23 for plans under 32 key tiles per query
// tile, attention.rs short_items; FLAMIA_BWD_KD_XPOSE=0|1|2 forces: against the quantiser's
// copy the quantiser -10%, this kernel +1..+2% at short lengths, the training call -1.2..-1.6%
// at 256x256 / 64x1024, -2.1% at d = 64, +0.9% at 1x65536, docs/perf.md "Session 23"): the
// consumers make it themselves at their item's start from the K/V slot's token-major K tile (xpose_kd_half: warpgroup c the HEAD_DIM / 2 dims its
// own dQ products read, each warp NP pairs with all loads in flight before the first store, out
// of place), no second TMA, no kd_full / kd_empty: sm.kd's rows of warpgroup c are read only by
// warpgroup c's dQ products, whose last of the previous item has completed (wg_wait 0) before the
// item's end, and the stores reach the first dQ through the first step's proxy fence and ds_ready
// arrival (every consumer thread's, dead steps included), which that dQ waits for.
#ifndef BWD_KD_XPOSE
#define BWD_KD_XPOSE 0
#endif
#if BWD_KD_XPOSE != 0 && BWD_KD_XPOSE != 2
#error "BWD_KD_XPOSE is 0 (the quantiser's copy) or 2 (the consumers' transpose)"
#endif
// BWD_VT_XPOSE 1 (host knob FLAMIA_BWD_VT_XPOSE=0|1, attention.rs short_items): the K/V
// slot's V tile is TMA-loaded from V's dim-major copy (the forward's operand; v_map then maps
// v_dim with 64-key boxes of the 64-byte swizzle, one per consumer warpgroup) and each consumer
// warpgroup transposes its half in place into the token-major rows its dP products read at its
// item's start (xpose_vt_half), so the Q/K/V quantiser writes no token-major V (a sixth of its
// bytes; with BWD_KD_XPOSE 2 a fifth of what is left) and the forward's saved operands hold
// none. Costs per item: 4 + 4 shared-memory instructions per warp (2 + 2 at d = 64), two
// barriers of the warpgroup's 128 threads and a proxy fence before its first dP product.
#ifndef BWD_VT_XPOSE
#define BWD_VT_XPOSE 0
#endif
// BWD_VT_VPERM 1 (the host sets it with BWD_VT_XPOSE when the v4 forward packs P by FWD_VPERM,
// attention.rs fwd_vperm): V's dim-major copy holds each 32-key block's keys in BWD_QPERM's
// order, and the transpose puts every key back in its own token-major row (xpose_vt_half).
#ifndef BWD_VT_VPERM
#define BWD_VT_VPERM 0
#endif
#if BWD_VT_VPERM && !BWD_VT_XPOSE
#error "BWD_VT_VPERM is the order of the dim-major V that BWD_VT_XPOSE transposes"
#endif
// BWD_COLS_TMA (the host defines it; src/gpu/attention.rs bwd_cols_tma): each step's per-query
// constants (BwdCols) come by one bulk copy from the table bwd_cols wrote before the launch
// ([query head][padded position / 2] column pairs), instead of the producer loading q_exp, do_exp,
// LSE and D and computing them per stage: the producer's stage is then TMA issues only, with no
// global-load latency on its chain. Measured (session 18, H200, same call): backward -2.8..-5.8%
// at 16x4096, 32x2048 and mixed lengths, noise at 256x256 and 64x1024. Same values from the same
// expressions (step_constants): bitwise the same gradients. Not with BWD_FOLD (its constants are
// folded per slot).
#ifndef BWD_COLS_TMA
#define BWD_COLS_TMA 0
#endif
#if BWD_COLS_TMA && BWD_FOLD
#error "BWD_COLS_TMA needs the per-stage constants unfolded (BWD_FOLD 0)"
#endif
// BWD_KEYS_TMA (the host defines it with BWD_COLS_TMA; src/gpu/attention.rs bwd_keys_tma): each
// item's per-key factors (BwdItem's kf, vf, cf for the steps, the tail's fk, fv for the item's
// end) come by two bulk copies, counted in kv_full's bytes, from records (BwdKeyRec per item code)
// that bwd_cols wrote before the launch, instead of the producer loading K's and V's exponents and
// the dV fold exponents for its 128 keys and computing them. Session 44's profile of the short
// documents (BWD_PROF_PHASES, H100, 256x256): those twelve loads, at the producer's 24 registers
// each spilled to local memory as it landed, took ~6,000-10,000 clocks per item between the next
// item's first stage and its K/V issue, and the consumers waited ~900 clocks per item for K and V.
// Measured (session 44, H100, same call): fused backward -1..-3% (256x256 -3%). Same values from
// the same expressions (key_factors): bitwise the same gradients. Not with CTA pairs (BWD_PAIR:
// each rank's own tile) or BWD_FOLD.
#ifndef BWD_KEYS_TMA
#define BWD_KEYS_TMA 0
#endif
#if BWD_KEYS_TMA && !BWD_COLS_TMA
#error "BWD_KEYS_TMA's records are bwd_cols' (BWD_COLS_TMA)"
#endif
#define BKT 128  // keys per work item (two consumer warpgroups x 64)
#define BQT 64   // queries per step
// BWD_L2_PROBE (timing only, wrong results: bench/device_s36.sh), bits: 1, odd steps skip their
// Q / dO TMA loads (the constants still come), so the consumers compute on the stage's stale
// codes: the same instructions and products with half the per-step L2 -> SM bytes; 2, each
// reducer skips every other dQ partial's reduce-add (half the L2 reduce traffic). 3 = both: the
// L2 traffic a pair of CTAs would leave that multicast Q / dO and add their dQ partials up first.
#ifndef BWD_L2_PROBE
#define BWD_L2_PROBE 0
#endif
// BWD_PAIR 1 (host knob FLAMIA_BWD_PAIR, attention.rs bwd_pair_env): the CTAs run in clusters
// of two, and a cluster's work item is a pair of adjacent key tiles 2m, 2m + 1 of one (document,
// query head), P.items listing the pair's lower tile (BwdSchedule::pairs).
// Rank r takes tile lower + r (rank 1 none when the lower tile is its document's last). Both
// walk the lower tile's query tiles, so the two rings hold the same Q / dO tiles in the same
// stages: each producer TMA-loads half of a stage's bytes (rank 0 Q, rank 1 dO, both layouts)
// into both CTAs at once (multicast), and each CTA's s_full expects the whole stage. A stage's
// s_empty counts both CTAs' consumer warps (the partner's by a remote arrival), since either
// producer's next load of that stage writes into both. The upper tile's walk is the lower's
// without the lower tile's diagonal query tiles (causal: the last two walking down, the first
// two walking up, BWD_WALK_UP): rank 1's consumers pass those stages on without work
// (bwd_step_pass), as they pass every stage of an item without an upper tile. Rank 0 claims
// the next pair and hands its index to rank 1 (sm.claim, claim_full / claim_empty across the
// cluster: the one cluster-scope release / acquire; every other remote arrival is a plain
// SYNCS.ARRIVE, mbar_arrive_remote). Each CTA computes and reduces its own tile exactly as
// unpaired (the same dQ turns): bitwise the unpaired gradients (GPU test
// cta_pairs_give_bitwise_the_unpaired_backward). What it saves is half of the Q / dO bytes
// out of L2 (session 35's probe, BWD_L2_PROBE 1: -2.2..-3.3% at 1x65536).
// BWD_PAIR 2 (FLAMIA_BWD_PAIR=2) also adds the pair's dQ partials up before one reduce-add per
// query tile that both tiles see (a "paired" step): the CTA of rank (q0 / 64) & 1 sums (the
// "summer"), so both CTAs' reducers share the work. Per consumer warp w: the partner's warp w
// stores its partial as always, then (__syncwarp) its lane 0 arrives with release at cluster
// scope on the summer's pdq_full[cw][w] (BWD_PAIR_STRICT, below); the summer's warp w waits
// with acquire at cluster scope and, its own partial stored, reads the partner's rows 16w.. (its own
// warp's rows: 8 x 16 bytes per lane, ld.shared::cluster), adds them into its buffer, releases
// the partner's buffer (a remote arrival of each lane on the partner's dq_empty, which counts
// 128: the reducer arrives with 128 at once) and hands the sum to its reducer, whose turn is the
// first of the pair's in the query tile's order (the lower tile's walking down, the upper's
// walking up) and which bumps the semaphore by 2 (two key tiles). The partner hands nothing to
// its reducer for that step. The two partials' sum is one FP32 addition (commutative): the same
// bits whichever CTA sums, fixed run to run, but not the unpaired backward's (whose dq_acc takes
// the two partials one after the other). Session 35's probe (BWD_L2_PROBE 3: half the Q / dO
// loads and half the reduces) put the traffic left at -7.7% of the backward at 1x65536.
#ifndef BWD_PAIR
#define BWD_PAIR 0
#endif
// (BWD_KEYS_TMA where it applies: not with CTA pairs, whose ranks hold other tiles of a pair's item)
#define BWD_KEYS (BWD_KEYS_TMA && !BWD_PAIR)
// BWD_BULK_ST 1 (the host's default at head dim 128 where tiles walk up: bwd_bulk_st;
// FLAMIA_BWD_BULK_ST=0|1): a warpgroup whose 64 keys all lie in the document sends its BF16 dK, then dV, through its half of the dS
// tiles (stage_frag_bf16_sw128: two 64 x 64-dim boxes at d = 128) by bulk tensor stores
// (bwd_box_store; dk_map / dv_map), as the forward's O goes (FWD_O_TMA), instead of 16-byte
// stores from the fragments; a warpgroup with keys past the document keeps those. The consumers
// wait for dK's boxes to be read out of the tiles before staging dV, and for dV's only at the
// next item's start (barrier 10 over both warpgroups, before its first dS codes go there), so
// dV's bytes drain under the next item's K/V wait and transposes. Session 44's knock-out at
// 256x256 (no dK/dV stores at all): fused backward -7%. Session 44's first version (one bulk copy
// per key row, each waited for at the item's end) measured +18% at 256x256 (session 45). The same
// bytes in the same places (GPU test dk_dv_by_bulk_copies_give_bitwise_the_same). Needs the four
// dS tiles (BWD_DEFER_DQ: 32 KB, both warpgroups' 64 rows of HEAD_DIM BF16); not with CTA pairs.
#ifndef BWD_BULK_ST
#define BWD_BULK_ST 0
#endif
#define BWD_BULK (BWD_BULK_ST && !BWD_PAIR)
#if BWD_PAIR && (!BWD_LATE_CLAIM || BWD_L2_PROBE)
#error "BWD_PAIR: with the late claim (the pairs' hand-over), without the L2 probe"
#endif
#if BWD_PAIR == 2 && BWD_DQ_BUFS != 1
#error "BWD_PAIR 2: one dQ buffer per warpgroup (the partner's buffer is the summer's by step)"
#endif
// BWD_PAIR_STRICT (BWD_PAIR 2; 1 by default, the host builds 0 for FLAMIA_BWD_PAIR_STRICT=0): the
// partner's partial handed to the summer as the PTX memory model asks for data one CTA writes
// and another reads: a release at cluster scope by the partner warp's lane 0 after the warp's
// __syncwarp (SASS: MEMBAR.ALL.GPU once per warp and paired step) and the summer's acquire at
// cluster scope (a CCTL.IVALL). 0: each lane's fence.acq_rel.cta (MEMBAR.ALL.CTA) and a remote
// arrival with the default semantics, CTA scope on both sides: cheaper, and the partner's stores
// have been performed before its arrival leaves the SM, but the model does not order a CTA-scope
// release and acquire of two CTAs (a data race on paper: session 37's review), so an A/B only.
#ifndef BWD_PAIR_STRICT
#define BWD_PAIR_STRICT 1
#endif

// A 128-key tile: document start, length, padded start, tile offset in the document, the
// document's first 64-query tile (global index, for the dQ semaphores), this key tile's global
// index (dkv semaphores), a spare slot (the consumers' copy keeps the head there) and whether the
// tile walks up (BWD_WALK_UP). Mirrors BwdSchedule::tiles in src/gpu/sched.rs.
struct BwdTile {
  int doc0, len, pad0, k0, qt0, kt, pad_a, up;
};

// Mirrors BwdV4Params in src/gpu/attention.rs.
struct BwdV4Params {
  // (token rows of HEAD_DIM bytes with the swizzle of that width: tok_off / desc_tok)
  TmaMap k_map;    // k_tok (HEAD_DIM B, Hkv, T), box (HEAD_DIM, 1, 128)
  TmaMap v_map;    // v_tok, same; BWD_VT_XPOSE: v_dim as qd_map (box 64 tokens, HEAD_DIM dims, 64-byte swizzle)
  TmaMap kd_map;   // k_dim (Tpad, Hkv * HEAD_DIM), box (128 tokens, HEAD_DIM dims)
  TmaMap q_map;    // q_tok (HEAD_DIM B, Hq, T), box (HEAD_DIM, 1, 64)
  TmaMap do_map;   // do_tok, same
  TmaMap qd_map;   // q_dim (Tpad, Hq * HEAD_DIM), box (64 tokens, HEAD_DIM dims), 64-byte swizzle
  TmaMap dod_map;  // do_dim, same
  TmaMap dq_map;   // dq_acc FP32 (HEAD_DIM, chunk heads, T or Tpad rows: dq_first_store), box (32, 1, 64), 128-byte swizzle
  AttnParams a;
  const int* items;  // key tile * hq + head, longest first
  const int* tiles;  // BwdTile per 128-key tile
  const int* cexp;   // c_j per (token, query head)
  float* dkv_acc;    // GQA partial dK/dV per (key tile, chunk KV head) (fragment order), null when hq == hkv
  int* counter;      // [2], zero at the launch (sched_done leaves it so)
  int* dq_sem;       // per (query head, global 64-query tile), zeroed
  int* kv_sem;       // per (KV head, key tile), zeroed
  const u8* colc;    // BWD_COLS_TMA: BwdColPair [Hq][Tpad / 2] (bwd_cols), null otherwise
  const u8* keys;    // BWD_KEYS_TMA: BwdKeyRec per item code (key tile * hq + head; bwd_cols), null otherwise
  int nitems, nqt, nkt;
  int h0, hk0, hkc;  // this launch's head chunk: query heads h0.., KV heads hk0..hk0 + hkc (scratch)
  int jitter;        // test knob: nonzero delays each dQ reduce by a pseudo-random few microseconds
  // 1: dq_acc's rows are the padded positions (document start padded to 64, as the dim-major
  // codes: no 64-row box reaches into the next document) and each (query tile, head) takes its
  // first partial (turn 0) by a TMA store, the later ones by reduce-add, so the accumulator needs
  // no zeroing; 0: token rows, zeroed by the host, every partial a reduce-add.
  int dq_first_store;
  int tpad;          // padded positions (BWD_COLS_TMA: colc's rows per head x 2)
  // (last, so that the other members' offsets, and the builds without them, stay as they were)
  TmaMap dk_map;     // BWD_BULK_ST: dK BF16 (HEAD_DIM, Hkv, T), box (64, 1, 64), 128-byte swizzle
  TmaMap dv_map;     // BWD_BULK_ST: dV, same
};

// Per-key factors the steps read (one copy: the next item's are written once this item's last
// step is done with them; unused under BWD_FOLD, whose steps read sm.cols' fold slots) ...
struct alignas(16) BwdItem {
  float kf[BKT];  // 2^eK per key (0 past the document)
  float vf[BKT];  // 2^eV
  float cf[BKT];  // 2^-c
};
// ... and what the item's last dQ hand-offs and its end read (BWD_TAILS copies: item n in
// tail[n % BWD_TAILS]).
// BWD_EARLY_FACTORS (the host's default; FLAMIA_BWD_EARLY_FACTORS=0 turns it off): the producer
// loads an item's per-key factors before it waits for the previous item's K/V slot (kv_empty),
// into a third tail copy and the step factors into sm.item_next (copied into sm.item once the
// slot is free), instead of after that wait. Session 18's producer clocks: it waited ~12,000 clocks
// per item at kv_empty and then took ~4,600-5,900 to arrive on kv_full, the factors' global loads;
// the consumers waited ~1,200-1,600 per item for kv_full after their item's end. Measured (H100,
// same call): training call -1.3% at 256x256, noise on four longer workloads; the consumers' wait
// for kv_full stayed (the K/V tiles' own latency, not the factors). A third copy
// because tail[n % 3] is last read by item n - 3's end, which precedes item n - 2's steps, whose
// K/V release the producer has already waited for; two copies would race item n - 2's end.
// With BWD_KEYS (the item's factors by bulk copy with K and V, after the kv_empty wait) nothing
// is written before that wait: two tails, as without early factors, and no item_next (session
// 49: 2,608 bytes less; bwd -1.5..-2.5% at 1x65536 on an H100 in five rounds of two calls,
// level at 2x32768, 16x4096 and 64x1024; docs/perf.md "Session 49").
#ifndef BWD_EARLY_FACTORS
#define BWD_EARLY_FACTORS 0  // the host defines it (2 KB more shared memory: attention.rs with_early_factors)
#endif
#define BWD_TAILS ((BWD_EARLY_FACTORS && !BWD_KEYS) ? 3 : 2)
#ifndef BWD_DS_STSM
// BWD_DS_STSM 1 (the host's default since session 26 with the four-code conversions, attention.rs
// bwd_ds_stsm; FLAMIA_BWD_DS_STSM=0 builds 0): the dS tile for dQ (ds_codes; row dS's dQ copy in
// row_ds_copies likewise since later in session 26, not yet run on a GPU there): per
// 32-query slice one PRMT per 8-query block puts a thread's codes of keys g and g + 8 side by
// side (16-bit elements), and one stmatrix.x4.trans writes the slice's four blocks as query rows,
// instead of 16 byte stores with their shifts; each 16-key group of the tile, and so of K's
// dim-major tile, then holds its keys in the order 0, 8, 1, 9, ... (the same keys inside each
// k32 slice of the dQ products: the same bits, as BWD_QPERM's query order). K's dim-major tile
// in that order comes from the consumers' transpose (BWD_KD_XPOSE 2: xpose_kd_half, XPOSE_ILEAVE)
// or from the quantiser (BWD_KD_XPOSE 0: the host has it write K's dim-major copy in that order,
// QUANT_ILEAVE_MASK). Session 26 (H200, same call, two rounds): backward -2.1..-3.5% at 32x2048,
// -1.0..-2.2% at 64x1024 and 256x256 (BWD_KD_XPOSE 2 plans); -0.5..-5.4% on long documents,
// -1.7 / -5.6% at d = 64 (BWD_KD_XPOSE 0 plans; docs/perf.md).
#define BWD_DS_STSM 0
#endif
#ifndef BWD_ST8
// dK and dV out by 8-byte predicated stores after one exchange per word pair
// (store_frag_row_bf16_x8, session 25: 200 SASS fewer per item end at d = 128 than the 16-byte
// stores' quad transposes, 100 at 64; the same bytes). Not in the d = 128 build without the
// upward walk (long documents: ptxas then keeps 4 LDL/STL in the interior step instead of 2, and
// a long item's end is a sliver of it). On since session 26 (H200, same call, two rounds:
// backward -1.1..-2.3% at 32x2048 without BWD_DS_STSM, within noise at 64x1024 and 256x256; with
// BWD_DS_STSM, on against off within noise either way, and the d = 128 walk-up build then keeps 3
// of dV's accumulators in local memory across the steps, at no measured cost).
#define BWD_ST8 (BWD_WALK_UP || HEAD_DIM != 128)
#endif
#ifndef BWD_DQ_STSM
// BWD_DQ_STSM 1 (the host's default since session 27, attention.rs bwd_dq_stsm;
// FLAMIA_BWD_DQ_STSM=0 builds 0; bwd_dq_convert is built with the same value): the FP32 dQ
// partial into shared memory by one stmatrix.x4 per 8-dim block (each FP32 as a pair of b16:
// thread (g, q) supplies row g, 4-byte column q of each 8 x 16-byte matrix) instead of 16
// 8-byte stores and the 32 FSELs that kept them free of bank conflicts (bwd_dq_store). Each
// 8-dim block of the partial, and so of dq_acc, then holds its dims in the order 0, 2, 4, 6, 1,
// 3, 5, 7 (position 4b + q: dim 2q + b), which bwd_dq_convert undoes:
// its Hadamard takes the stages in the same dim-bit order (bit 0 across lanes first), so the
// same sums in the same order: bitwise the same dQ (GPU test
// dq_partials_by_stmatrix_give_bitwise_the_same; scripts/dq_stsm_model.py checks the bytes and
// the bits without a GPU). Census (kernel-regs.py --bwd-per-step): see docs/perf.md "Session 26".
// Session 27 (H200, same call, two rounds): backward -1.6% at 1x65536, -3.6% at 8x8192,
// -0.3..-2.0% on the other d = 128 workloads; d = 64 within noise (+0.4..-0.1%).
#define BWD_DQ_STSM 0
#endif
struct BwdItemTail {
  int code, h;
#if BWD_PAIR
  int own, pass;  // whether this CTA has a tile in the pair; stages it passes on besides its steps
  int partner;    // whether the other CTA has one (the pair has both tiles)
#endif
  BwdTile tile;
  alignas(16) float fk[BKT];  // scale 2^-eK: dK's unfold at the item's end (16-byte aligned: BWD_KEYS_TMA's bulk copy)
  float fv[BKT];              // 2^c: dV's unfold
};
// BWD_KEYS_TMA's record of one item (code = key tile * hq + head): its BwdItem (kf, vf, cf) and
// its tail's fk, fv, in that order (two bulk copies), written by bwd_cols.
struct BwdKeyRec {
  float kf[BKT], vf[BKT], cf[BKT];
  float fk[BKT], fv[BKT];
};
static_assert(sizeof(BwdKeyRec) == 5 * BKT * 4, "BwdKeyRec: five 128-float arrays (src/gpu/attention.rs BWD_KEY_REC_BYTES)");

// Per-query constants of one step (0 / -inf past the document: those columns drop out), by
// column pair: a consumer thread's columns come in pairs 8j + 2q, +1, so one 16-byte load gives
// a pair's qf and nl, one its dq and nd, one 8-byte load its pe (24 loads per step, was 40).
struct alignas(16) BwdColPair {
  float2 qf, nl;  // 2^eQ * scale * log2(e); -LSE * log2(e)
  float2 dq, nd;  // 2^(edO + eQ); -D * 2^eQ
  float2 pe, pad; // 2^edO
};
// One query's step constants (the BwdColPair fields) from its exponents, LSE and D (element e of
// the [T, Hq] tables), or those of a column past the document (ok false): the producer's per
// stage and bwd_cols' table (BWD_COLS_TMA) both come from here, so they are the same bits.
__device__ __forceinline__ void step_constants(float (&c)[5], bool ok, long long e, const i8* q_exp, const i8* do_exp,
                                               const float* lse, const float* delta, float scale_log2) {
  const float fq = ok ? exp2i(q_exp[e]) : 0.f;
  const float fo = ok ? exp2i(do_exp[e]) : 0.f;
  c[0] = fq * scale_log2;
  c[1] = ok ? -lse[e] * LOG2E : NEG_INF;
  c[2] = fo * fq;
  c[3] = ok ? -delta[e] * fq : 0.f;
  c[4] = fo;
}
#if BWD_FOLD
// BWD_FOLD: per stage the column constants of every column pair folded with the factors of slot
// b: the tile's 32-key block b (0..3) or, slot 4, factors 0 (what a key past the document has).
#define BWD_FOLD_SLOTS 5
struct BwdCols {
  float4 qn[BWD_FOLD_SLOTS][BQT / 2];  // qf 2^eK (pair), nl (pair)
  float4 ab[BWD_FOLD_SLOTS][BQT / 2];  // dq 2^(eV+eK) (pair), nd 2^eK (pair)
  float2 pc[BWD_FOLD_SLOTS][BQT / 2];  // pe 2^-c (pair)
};
#else
struct BwdCols {
  BwdColPair p[BQT / 2];
};
#endif

// One step's dQ partial of a consumer warpgroup, handed to its reducer warp: where it goes, the
// semaphore that admits it and the count to wait for (end != 0: no more partials).
struct BwdDqJob {
  int h, row, sem, target, end, pad_a, pad_b, pad_c;  // (BWD_PAIR 2: pad_a the semaphore's bump)
};

struct BwdV4Smem {
  u8 k[BKT * HEAD_DIM];                // row = key (tok_off)
  u8 v[BKT * HEAD_DIM];
  u8 kd[HEAD_DIM * BKT];               // row = dim, 128 keys
  u8 q[BWD_STAGES][BQT * HEAD_DIM];    // row = query
  u8 dO[BWD_STAGES][BQT * HEAD_DIM];
  u8 qd[BWD_STAGES][HEAD_DIM * BQT];   // 64-byte swizzle, row = dim, 64 queries
  u8 dOd[BWD_STAGES][HEAD_DIM * BQT];
  u8 dqs[BWD_DQ_BUFS][2][HEAD_DIM / 64][BQT * 128];  // [buffer][warpgroup][32 dims] FP32 dQ partial, 128-byte swizzle
  u8 ds[BWD_DS_BUFS][BQT * BKT];       // dS codes [64 queries][128 keys], no-swizzle K-major
  BwdCols cols[BWD_STAGES];
  BwdItem item;
#if BWD_EARLY_FACTORS && !BWD_FOLD && !BWD_KEYS
  BwdItem item_next;                   // the next item's step factors until item is free (the producer's)
#endif
#if BWD_FOLD
  float4 pfold[BWD_FOLD_SLOTS];        // the producer's: the item's 2^eK, 2^(eV+eK), 2^-c per fold slot
#endif
  BwdItemTail tail[BWD_TAILS];
  float red[2][8][2];                  // [step parity][consumer warp][query slice] block maxima
#ifdef BWD_PROF_REDUCER
  long long redprof[2][6];             // [reducer] partials, clocks, waits: partial, turn, read, landed
#endif
  int dse[BWD_DS_BUFS][2][4];          // [dS buffer][query block][key block] exponents
#if BWD_ROW_DS
  float2 redc[2][8][32];               // [step parity][consumer warp][lane] column maxima (row dS)
  float2 fcol[8][32];                  // [consumer warp][lane] 2^-e of the lane's two columns (row dS)
  i8 dser[BWD_DS_BUFS][BQT][4];        // [dS buffer][query][key block] exponents of dQ's copy (row dS)
#endif
  BwdDqJob job[BWD_DQ_BUFS][2];        // [buffer][warpgroup] the dQ partial now in dqs[buffer][warpgroup]
  BwdTile cur[2];                      // [warpgroup] its item's tile (h in pad_a), for the hand-off: thread 0's
  u64 kv_full, kv_empty, kd_full, kd_empty, s_full[BWD_STAGES], s_empty[BWD_STAGES];
  u64 dq_full[BWD_DQ_BUFS][2], dq_empty[BWD_DQ_BUFS][2];  // dqs handed to the reducer / read by TMA
  u64 ds_ready[BWD_DS_BUFS];           // both warpgroups' dS codes and exponents of a step written
#if BWD_PAIR
  u64 claim_full, claim_empty;         // rank 1's: the next pair's index is in claim; rank 0's: claim read
  int claim;                           // (rank 1's) written by rank 0's producer
#endif
#if BWD_PAIR == 2
  u64 pdq_full[2][4];                  // [warpgroup][warp] the partner's warp has stored its dQ partial (summer's)
#endif
};
#ifdef SMEM_BWD4_BUDGET
static_assert(sizeof(BwdV4Smem) + 1024 <= SMEM_BWD4_BUDGET, "attn_bwd_v4: dynamic shared memory budget too small");
#endif

// ---- primitives --------------------------------------------------------------------------------
// BWD_HANG_TRAP (test builds: the host's FLAMIA_BWD_HANG_TRAP=1): a consumer wait that has not
// returned after 2^33 clocks (~4.5 s) prints the CTA, the thread, the wait's site (below), the
// barrier's shared-memory address and parity, and traps, so a protocol hang fails its test with
// a place instead of running into the test's timeout. Sites: 1 s_full (step), 2 s_full (dead
// step), 3 s_full (passed stage), 4 pdq_full, 5 ds_ready, 6 dq_empty, 7 kv_full, 8 kd_full, 9
// dq_empty (the end). Consumer warps only: the producer warpgroup's 24 registers leave no room
// for the printf (sessions 12-13). Off: bwd_wait is mbar_wait.
#ifdef BWD_HANG_TRAP
__device__ __noinline__ void bwd_hang(u32 bar, u32 parity, int site) {
  printf("attn_bwd_v4 hang: cta %d thread %d site %d barrier smem 0x%x parity %u\n", (int)blockIdx.x, (int)threadIdx.x,
         site, bar, parity);
  __trap();
}
template <bool CLUSTER = false>  // (CLUSTER: acquire at cluster scope, bwd_wait_cluster)
__device__ __forceinline__ void bwd_wait(u32 bar, u32 parity, int site) {
  const long long t0 = clock64();
  while (!mbar_try_wait<CLUSTER>(bar, parity))
    if (clock64() - t0 > (1ll << 33)) bwd_hang(bar, parity, site);
}
#define bwd_wait_cluster(bar, parity, site) bwd_wait<true>(bar, parity, site)
#else
#define bwd_wait(bar, parity, site) mbar_wait(bar, parity)
#define bwd_wait_cluster(bar, parity, site) mbar_wait<true>(bar, parity)
#endif
__device__ __forceinline__ void tma_reduce_add_3d(const TmaMap* map, u32 src, int x, int y, int z) {
  asm volatile("cp.reduce.async.bulk.tensor.3d.global.shared::cta.add.tile.bulk_group [%0, {%2, %3, %4}], [%1];\n" ::"l"(
                   (u64)map),
               "r"(src), "r"(x), "r"(y), "r"(z)
               : "memory");
}
// A shared-memory load the compiler may not hoist or keep across steps (short live ranges).
__device__ __forceinline__ float lds_volatile(const float* p) {
  float v;
  asm volatile("ld.volatile.shared.f32 %0, [%1];\n" : "=f"(v) : "r"(smem_u32(p)));
  return v;
}
__device__ __forceinline__ void fence_async_global() { asm volatile("fence.proxy.async.global;\n" ::: "memory"); }
__device__ __forceinline__ int ld_acquire(const int* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void red_release_add(int* p, int v) {
  asm volatile("red.release.gpu.global.add.s32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ void spin_until(const int* p, int target) {
  while (ld_acquire(p) < target) __nanosleep(64);
}
// Exponent of the operand fold, clamped as exp2i clamps (the unfold must use the same value).
__device__ __forceinline__ int fold_exp(int e) { return max(e, -126); }
// One key's item factors, f = (kf, vf, cf, fk, fv): 2^eK, 2^eV, 2^-c for the steps, scale
// 2^-fold(eK) and 2^c for the item's end, of key `key` of the tile starting at token doc0 (query
// head h, KV head hk) from the [T, Hkv] exponent tables and the dV fold exponents [T, Hq]; all 0
// where ok is false (a key past the document). The producer's per item and bwd_cols' records
// (BWD_KEYS_TMA) both come from here, so they are the same bits.
__device__ __forceinline__ void key_factors(float (&f)[5], bool ok, int doc0, int key, int h, int hk, int hq, int hkv,
                                            const i8* k_exp, const i8* v_exp, const int* cexp, float scale) {
  const long long e = (long long)(doc0 + (ok ? key : 0)) * hkv + hk;
  const int ek = ok ? k_exp[e] : 0, c = ok ? cexp[(long long)(doc0 + key) * hq + h] : 0;
  f[0] = ok ? exp2i(ek) : 0.f;
  f[1] = ok ? exp2i(v_exp[e]) : 0.f;
  f[2] = ok ? exp2i(-c) : 0.f;
  f[3] = ok ? scale * exp2i(-fold_exp(ek)) : 0.f;
  f[4] = ok ? exp2i(c) : 0.f;
}

// Dead steps of a warpgroup's item (BWD_SKIP_DEAD) among its nmask masked ones: all of them when
// none of its keys is in the document (lim < 0), causal the second warpgroup's step at the tile's
// first query tile, else none.
__device__ __forceinline__ int bwd_dead_steps(int nmask, int lim, int causal, int cw) {
  return BWD_SKIP_DEAD ? min(nmask, lim < 0 ? nmask : (causal && cw == 1 ? 1 : 0)) : 0;
}

__device__ __forceinline__ int bwd_steps(const BwdTile& t, int causal) {
  const int qstart = causal ? t.k0 : 0;
  return (t.len - qstart + BQT - 1) / BQT;
}

// BWD_PROF_PHASES also times the producer (lane 0, clocks summed over its items, printed with
// the consumers' phases): [0] from the claim of an item to its first stage's TMA issue (the
// atomic, the item and tile loads, the wait for a free stage), [1] that free-stage wait alone,
// [2] waiting for the previous item's K and V to be released (kv_empty: the producer is early),
// [3] from there to its kv_full arrival (the K/V issue and the per-key factors' loads), [4]
// items, [5] the free-stage waits of the later stages.
#ifdef BWD_PROF_PHASES
__shared__ long long bwd_prod_clk[6];
#define PROD_T(v) const long long v = clock64()
#define PROD_ACC(k, v) \
  if (lane == 0) bwd_prod_clk[k] += clock64() - (v)
#else
#define PROD_T(v)
#define PROD_ACC(k, v)
#endif

#if BWD_PAIR
// The cluster's next pair (lane 0 of both producers, after their item ni's last stage): rank 0
// claims it and writes it into rank 1's claim once rank 1 has read the previous one.
__device__ __forceinline__ int bwd_pair_claim(const BwdV4Params& P, BwdV4Smem& sm, u32 rank, int ni) {
  if (rank == 0) {
    const int next = atomicAdd(P.counter, 1) + (int)(gridDim.x >> 1);
    mbar_wait<true>(smem_u32(&sm.claim_empty), (ni & 1) ^ 1);
    st_shared_cluster(mapa_shared(smem_u32(&sm.claim), 1), next);
    mbar_arrive_cluster(mapa_shared(smem_u32(&sm.claim_full), 1));
    return next;
  }
  mbar_wait<true>(smem_u32(&sm.claim_full), ni & 1);
  const int next = *reinterpret_cast<volatile int*>(&sm.claim);
  mbar_arrive_cluster(mapa_shared(smem_u32(&sm.claim_empty), 0));
  return next;
}
#define BWD_OWN own  // this CTA has a tile in the item (the pair's lower or upper)
#else
#define BWD_OWN (code >= 0)
#endif

// ---- producer ----------------------------------------------------------------------------------
__device__ __forceinline__ void bwd_producer(const BwdV4Params& P, BwdV4Smem& sm) {
  const AttnParams& a = P.a;
  const int lane = threadIdx.x & 31;
#ifdef BWD_PROF_PHASES
  if (lane == 0)
    for (int i = 0; i < 6; ++i) bwd_prod_clk[i] = 0;
  long long t_claim = clock64();
#endif
  if (lane == 0) {
    tma_prefetch(&P.k_map);
    tma_prefetch(&P.v_map);
#if !BWD_KD_XPOSE
    tma_prefetch(&P.kd_map);
#endif
    tma_prefetch(&P.q_map);
    tma_prefetch(&P.do_map);
    tma_prefetch(&P.qd_map);
    tma_prefetch(&P.dod_map);
  }
  int s = 0;
  u32 ph = 0;
#if BWD_PAIR
  const u32 rank = cluster_ctarank();
  int idx = blockIdx.x >> 1;  // the cluster's first pair
#else
  int idx = blockIdx.x;
#endif
  for (int ni = 0;; ++ni) {
    const int code = idx < P.nitems ? P.items[idx] : -1;
    int h = 0;
    BwdTile t{};
#if BWD_PAIR
    BwdTile tw{};  // the pair's lower tile, whose query tiles both CTAs walk
    bool own = false, both = false;
#endif
    if (code >= 0) {
      const int tile = code / a.hq;
      h = code - tile * a.hq;
      t = reinterpret_cast<const BwdTile*>(P.tiles)[tile];
#if BWD_PAIR
      tw = t;
      if (tile + 1 < P.nkt) {  // the upper tile, if the document has it
        const BwdTile tu = reinterpret_cast<const BwdTile*>(P.tiles)[tile + 1];
        both = tu.doc0 == t.doc0 && tu.k0 == t.k0 + BKT;
        if (rank != 0 && both) t = tu;
      }
      own = rank == 0 || both;
#endif
    }
    const int hk = h / (a.hq / a.hkv);
#if BWD_PAIR
    const int qstart = a.causal ? tw.k0 : 0, n = code >= 0 ? bwd_steps(tw, a.causal) : 0;
#else
    const int qstart = a.causal ? t.k0 : 0, n = code >= 0 ? bwd_steps(t, a.causal) : 0;
#endif
    // Step st of this item: Q, dO (both layouts) and the per-query constants into the next stage.
    const auto load_stage = [&](int st) {
#if BWD_WALK_UP
      const int q0 = t.up ? qstart + BQT * st : qstart + BQT * (n - 1 - st);
#else
      const int q0 = qstart + BQT * (n - 1 - st);
#endif
      // the stage's slot, once free: Q and dO by TMA into it (its barrier)
      const auto issue = [&]() {
        PROD_T(t_se);
        mbar_wait(smem_u32(&sm.s_empty[s]), ph ^ 1);
        PROD_ACC(st == 0 ? 1 : 5, t_se);
        const u32 bar = smem_u32(&sm.s_full[s]);
#if BWD_L2_PROBE & 1  // (timing only, wrong results: only every other step's Q / dO bytes loaded)
        if (lane == 0 && (st & 1)) {
#if BWD_COLS_TMA
          mbar_expect_tx(bar, (u32)sizeof(BwdCols));
          bulk_load(smem_u32(&sm.cols[s]), P.colc + ((long long)h * (P.tpad / 2) + (t.pad0 + q0) / 2) * sizeof(BwdColPair),
                    (u32)sizeof(BwdCols), bar);
#endif
        } else
#endif
        if (lane == 0) {
#if BWD_COLS_TMA
          mbar_expect_tx(bar, 4 * BQT * HEAD_DIM + (u32)sizeof(BwdCols));
          bulk_load(smem_u32(&sm.cols[s]), P.colc + ((long long)h * (P.tpad / 2) + (t.pad0 + q0) / 2) * sizeof(BwdColPair),
                    (u32)sizeof(BwdCols), bar);
#else
          mbar_expect_tx(bar, 4 * BQT * HEAD_DIM);
#endif
#if BWD_PAIR  // (this CTA's half into both: rank 0 Q, rank 1 dO)
          if (rank == 0) {
            tma_load_3d_mc(smem_u32(sm.q[s]), &P.q_map, bar, 0, h, t.doc0 + q0, 3);
            tma_load_2d_mc(smem_u32(sm.qd[s]), &P.qd_map, bar, t.pad0 + q0, h * HEAD_DIM, 3);
          } else {
            tma_load_3d_mc(smem_u32(sm.dO[s]), &P.do_map, bar, 0, h, t.doc0 + q0, 3);
            tma_load_2d_mc(smem_u32(sm.dOd[s]), &P.dod_map, bar, t.pad0 + q0, h * HEAD_DIM, 3);
          }
#else
          tma_load_3d(smem_u32(sm.q[s]), &P.q_map, bar, 0, h, t.doc0 + q0);
          tma_load_3d(smem_u32(sm.dO[s]), &P.do_map, bar, 0, h, t.doc0 + q0);
          tma_load_2d(smem_u32(sm.qd[s]), &P.qd_map, bar, t.pad0 + q0, h * HEAD_DIM);
          tma_load_2d(smem_u32(sm.dOd[s]), &P.dod_map, bar, t.pad0 + q0, h * HEAD_DIM);
#endif
        }
        return bar;
      };
      const u32 bar = issue();
#ifdef BWD_PROF_PHASES
      if (st == 0) PROD_ACC(0, t_claim);
#endif
#if !BWD_COLS_TMA
      float c[5][2];  // qf, nl, dq, nd, pe of this lane's pair of queries 2 lane, +1
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int i = 2 * lane + j;
        const bool ok = q0 + i < t.len;
        const long long e = (long long)(t.doc0 + (ok ? q0 + i : 0)) * a.hq + h;
        float cj[5];
        step_constants(cj, ok, e, a.q_exp, a.do_exp, a.lse, a.delta, a.scale_log2);
#pragma unroll
        for (int k = 0; k < 5; ++k) c[k][j] = cj[k];
      }
#if BWD_FOLD
      // folded per slot with the consumers' products (qf kf, dq vk, nd kf, pe cf)
      BwdCols& fc = sm.cols[s];
#pragma unroll
      for (int b = 0; b < BWD_FOLD_SLOTS; ++b) {
        const float4 f = sm.pfold[b];  // kf, vk, cf
        fc.qn[b][lane] = make_float4(c[0][0] * f.x, c[0][1] * f.x, c[1][0], c[1][1]);
        fc.ab[b][lane] = make_float4(c[2][0] * f.y, c[2][1] * f.y, c[3][0] * f.x, c[3][1] * f.x);
        fc.pc[b][lane] = make_float2(c[4][0] * f.z, c[4][1] * f.z);
      }
#else
      BwdColPair& cp = sm.cols[s].p[lane];
      *reinterpret_cast<float4*>(&cp.qf) = make_float4(c[0][0], c[0][1], c[1][0], c[1][1]);
      *reinterpret_cast<float4*>(&cp.dq) = make_float4(c[2][0], c[2][1], c[3][0], c[3][1]);
      cp.pe = make_float2(c[4][0], c[4][1]);
#endif
#endif  // !BWD_COLS_TMA
      mbar_arrive(bar);
      if (++s == BWD_STAGES) { s = 0; ph ^= 1; }
    };
#if BWD_FOLD
    // The item's factors per fold slot, for its stages (sm.item is still the previous item's
    // here): lane b < 4 those of the tile's 32-key block b, the values sm.item holds for each of
    // its keys inside the document (uniform per block) or 0 if it has none; lane 4 factors 0.
    // Read only by this warp's stages: the previous item's have all been written.
    __syncwarp();
    if (lane < BWD_FOLD_SLOTS) {
      const int key = t.k0 + 32 * lane;
      const bool ok = BWD_OWN && lane < 4 && key < t.len;
      const long long e = (long long)(t.doc0 + (ok ? key : 0)) * a.hkv + hk;
      const int ek = ok ? a.k_exp[e] : 0, c = ok ? P.cexp[(long long)(t.doc0 + key) * a.hq + h] : 0;
      const float kf = ok ? exp2i(ek) : 0.f, vf = ok ? exp2i(a.v_exp[e]) : 0.f, cf = ok ? exp2i(-c) : 0.f;
      sm.pfold[lane] = make_float4(kf, vf * kf, cf, 0.f);
    }
    __syncwarp();
#endif
    // The item's first stage goes out while the previous item's last steps still hold K and V.
    if (n > 0) load_stage(0);
    // K and V (and the step factors in item, the header and end factors in tail[ni % BWD_TAILS])
    // once the previous item's last steps have read its K and V: lane 0 sets the bytes without
    // arriving, every lane writes its 4 keys' factors (BWD_EARLY_FACTORS: before the wait, into
    // the tail; then copies the step factors into item) and arrives.
    BwdItemTail& tail = sm.tail[ni % BWD_TAILS];
#if !BWD_FOLD && !BWD_KEYS
#if BWD_EARLY_FACTORS
    BwdItem& it = sm.item_next;
#else
    BwdItem& it = sm.item;
#endif
#endif
    const u32 kvbar = smem_u32(&sm.kv_full);
    const auto kv_issue = [&]() {
      if (lane == 0) {
        tail.code = code;
        tail.h = h;
        tail.tile = t;
#if BWD_PAIR
        tail.own = own;
        tail.pass = n - (own ? bwd_steps(t, a.causal) : 0);
        tail.partner = both;
#endif
        if (BWD_OWN) {
          mbar_expect_tx(kvbar, 2 * BKT * HEAD_DIM + (BWD_KEYS ? (u32)sizeof(BwdKeyRec) : 0u));
#if BWD_KEYS
          // the item's factors: the steps' into sm.item (free: the previous item's steps are
          // done, kv_wait), the end's into this item's tail
          const BwdKeyRec* rec = reinterpret_cast<const BwdKeyRec*>(P.keys) + code;
          bulk_load(smem_u32(&sm.item), rec->kf, 3 * BKT * 4, kvbar);
          bulk_load(smem_u32(tail.fk), rec->fk, 2 * BKT * 4, kvbar);
#endif
          tma_load_3d(smem_u32(sm.k), &P.k_map, kvbar, 0, hk, t.doc0 + t.k0);
#if BWD_VT_XPOSE
          // (dim-major, one 64-key half per consumer warpgroup: xpose_vt_half)
          tma_load_2d(smem_u32(sm.v), &P.v_map, kvbar, t.pad0 + t.k0, hk * HEAD_DIM);
          tma_load_2d(smem_u32(sm.v) + 64 * HEAD_DIM, &P.v_map, kvbar, t.pad0 + t.k0 + 64, hk * HEAD_DIM);
#else
          tma_load_3d(smem_u32(sm.v), &P.v_map, kvbar, 0, hk, t.doc0 + t.k0);
#endif
        }
      }
    };
    const auto kv_wait = [&]() {
      PROD_T(t_kve);
      mbar_wait(smem_u32(&sm.kv_empty), (ni & 1) ^ 1);
      PROD_ACC(2, t_kve);
    };
    PROD_T(t_kvf);
#if !BWD_EARLY_FACTORS && !BWD_KEYS
    kv_wait();
    kv_issue();
#endif
#if BWD_KEYS
    // (the factors come with K and V: kv_issue's bulk copies of the item's record)
    kv_wait();
    PROD_ACC(3, t_kvf);
    PROD_T(t_kvi);
    kv_issue();
    mbar_arrive(kvbar);
    PROD_ACC(3, t_kvi);
#else
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int key = t.k0 + 4 * lane + j;
      const bool ok = BWD_OWN && key < t.len;
      float f[5];
      key_factors(f, ok, t.doc0, key, h, hk, a.hq, a.hkv, a.k_exp, a.v_exp, P.cexp, a.scale);
#if !BWD_FOLD  // (BWD_FOLD: the steps read the fold slots instead)
      it.kf[4 * lane + j] = f[0];
      it.vf[4 * lane + j] = f[1];
      it.cf[4 * lane + j] = f[2];
#endif
      tail.fk[4 * lane + j] = f[3];
      tail.fv[4 * lane + j] = f[4];
    }
#if BWD_EARLY_FACTORS
    kv_wait();
    PROD_ACC(3, t_kvf);  // (here: the factors' loads, the kv_empty wait included; [2] the wait alone)
    PROD_T(t_kvi);
    kv_issue();
#if !BWD_FOLD
    // this lane's keys' step factors into item (its own writes above: no other lane's)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int k = 4 * lane + j;
      sm.item.kf[k] = it.kf[k];
      sm.item.vf[k] = it.vf[k];
      sm.item.cf[k] = it.cf[k];
    }
#endif
    mbar_arrive(kvbar);
    PROD_ACC(3, t_kvi);
#else
    mbar_arrive(kvbar);
    PROD_ACC(3, t_kvf);
#endif
#endif  // BWD_KEYS
#ifdef BWD_PROF_PHASES
    if (lane == 0) bwd_prod_clk[4] += code >= 0;
#endif
    if (code < 0) {
      if (lane == 0) sched_done(P.counter);
      return;
    }
    int next = 0;
#if !BWD_LATE_CLAIM
    if (lane == 0) next = atomicAdd(P.counter, 1) + (int)gridDim.x;
#endif
#if BWD_KD_XPOSE != 2  // (2: the consumers make the dim-major K from the K/V slot's)
    // dim-major K (the dQ products' B operand) once the previous item's last dQ has read it
    // (waiting for that before the factors above delays K/V: measured slower, session 6 call 6)
    mbar_wait(smem_u32(&sm.kd_empty), (ni & 1) ^ 1);
    if (lane == 0) {
      const u32 kdbar = smem_u32(&sm.kd_full);
#if BWD_PAIR
      if (own)
#endif
      {
        mbar_expect_tx(kdbar, HEAD_DIM * BKT);
        tma_load_2d(smem_u32(sm.kd), &P.kd_map, kdbar, t.pad0 + t.k0, hk * HEAD_DIM);
      }
      mbar_arrive(kdbar);
    }
#endif
    for (int st = 1; st < n; ++st) load_stage(st);
#if BWD_LATE_CLAIM
#ifdef BWD_PROF_PHASES
    t_claim = clock64();
#endif
#if BWD_PAIR
    if (lane == 0) next = bwd_pair_claim(P, sm, rank, ni);
#else
    if (lane == 0) next = atomicAdd(P.counter, 1) + (int)gridDim.x;
#endif
#endif
    idx = __shfl_sync(0xffffffffu, next, 0);
  }
}
#undef BWD_OWN


// BWD_PROF_PHASES (timing only): clocks per phase of a step, summed by thread 0 of each consumer
// warpgroup of CTAs 0-1 and printed at the end. Phases: 0 between steps, 1 stage wait and the S
// and dP products, 2 P and dS elementwise, 3 block maxima and pair barrier, 4 E4M3 codes, 5 dV,
// 6 dK, 7 dS hand-over (fence, arrive), 8 wait for both warpgroups' dS, 9 dQ products, 10 dQ
// partial to shared memory, 11 hand-off to the reducer warp; per item: 12 the item's end (dK/dV
// unfold, GQA sums, stores), 13 waiting for the next item's K and V. Knock-outs (timing only, wrong
// results): BWD_PROF_NOSTORE (the item's end stores nothing), BWD_PROF_NOHAD (no Hadamard on dK),
// BWD_PROF_NOSEM / BWD_PROF_NORED (dQ reduces unordered / left out), BWD_PROF_NODQ (no dQ products),
// BWD_PROF_NOXPOSE (no K / V transposes at the item's start, nor their barrier: what phase 0's
// ~1,900 clocks per item at 256x256 really hold, session 44's profile having put them there while
// the transposes are 4 + 4 shared-memory instructions per warp).
#ifdef BWD_PROF_PHASES
__shared__ long long bwd_phase_clk[2][14];
__shared__ long long bwd_phase_last[2];
#define BWD_PHASE(k)                                                   \
  do {                                                                 \
    if ((threadIdx.x & 127) == 0) {                                    \
      const long long _c = clock64();                                  \
      bwd_phase_clk[C.cw][k] += _c - bwd_phase_last[C.cw];             \
      bwd_phase_last[C.cw] = _c;                                       \
    }                                                                  \
  } while (0)
#else
#define BWD_PHASE(k) \
  do {               \
  } while (0)
#endif

// ---- consumers ---------------------------------------------------------------------------------
// Per-CTA state of a consumer warpgroup that outlives a step.
struct BwdConsumer {
  int cw;
  // Thread indices, recomputed where used (no registers held across the item's steps).
  __device__ __forceinline__ int t() const { return threadIdx.x & 127; }
  __device__ __forceinline__ int w() const { return (threadIdx.x >> 5) & 3; }
  __device__ __forceinline__ int lane() const { return threadIdx.x & 31; }
  __device__ __forceinline__ int g() const { return (threadIdx.x & 31) >> 2; }
  __device__ __forceinline__ int qd() const { return threadIdx.x & 3; }
  int s;        // stage
  u32 ph;       // stage parity
  int nstep;    // steps run so far by this CTA (dS buffer / dQ hand-off parity)
#if BWD_PAIR == 2
  int npsum;    // pair sums made so far (pdq_full parity)
#endif
#ifdef BWD_PROF_PHASES
  int nitem;  // items finished
#endif
#ifdef BWD_PROF_TIMERS
  long long prof[6];  // clocks waiting: stage, pair barrier, 256 barrier, dQ buffer, item; steps
#endif
};

// dS~ (already divided by 2^e per slice) -> E4M3: the A fragments of dK = dS^T Q (registers) and
// the transposed bytes of the dQ operand (shared memory, row = query, K = keys).
// `ds` points at this thread's byte of the tile, tile_off<BKT>(2q, key0) with key0 = the
// fragment's row 16w + g (+ 64c): the other 31 bytes are at immediate offsets from it.
// Stores the thread's E4M3 codes R0 (rows g, queries 2q, 2q+1) and R8 (key row + 8) of one 8-query
// column block into the dS tile at d = its byte for the block (1024-byte row groups apart).
__device__ __forceinline__ void ds_store_block(u8* d, u32 R0, u32 R8) {
  d[0] = (u8)R0;
  d[16] = (u8)(R0 >> 8);
  d[8] = (u8)R8;
  d[24] = (u8)(R8 >> 8);
}

// BWD_QPERM 1 (the host's default since session 15, -0.4..-3.4% backward; FLAMIA_BWD_QPERM=0
// builds 0): P~^T and dS~^T are packed into the dV and
// dK products' A fragments without shuffles (codes_to_afrag_perm), and the host has the
// quantisers write Q's and dO's dim-major copies (those products' B operands, read by nothing
// else of the v4 backward) with the matching query order in each 32-query block.
#ifndef BWD_QPERM
#define BWD_QPERM 0
#endif
// BWD_CVT4 1 (with BWD_QPERM, the default; the host builds 0 for FLAMIA_BWD_CVT4=0; session 17:
// backward -0.7..-2.5% from 4x16384 to 64x1024 and lognormal, training call -0.4..-1.7% on eight
// of the nine workloads, +0.1% at 64x1024; d = 64 -0.6..+0.9%, noise): the key-permuted A fragments
// built by cvt_e4m3x4 (each register's two code pairs converted into its two halves) instead of
// cvt_e4m3x2 pairs, their 16-bit zero-extensions and a PRMT per register; the dS tile's bytes are
// shifted out of those registers. The same codes in the same places: bitwise the same gradients.
#ifndef BWD_CVT4
#define BWD_CVT4 BWD_QPERM
#endif
#if BWD_DS_STSM && !BWD_CVT4
#error "BWD_DS_STSM needs BWD_CVT4"
#endif
#if BWD_CVT4 && !BWD_QPERM
#error "BWD_CVT4 packs the key-permuted fragments (BWD_QPERM)"
#endif
__device__ __forceinline__ void dkv_afrag(const float (&v)[32], u32 (&a)[2][4]) {
#if BWD_CVT4
#pragma unroll
  for (int kk = 0; kk < 2; ++kk) slice_afrag_cvt4(v, kk, a[kk]);
#else
  acc_to_afrag<BWD_QPERM>(v, a);
#endif
}

__device__ __forceinline__ void ds_stsm(const u8* row, u32 r0, u32 r1, u32 r2, u32 r3) {
  stsm_x4_trans(smem_u32(row), r0, r1, r2, r3);
}
__device__ __forceinline__ void ds_codes(const float (&v)[32], u32 (&a)[2][4], u8* ds) {
#if BWD_DS_STSM
  // `ds`: this lane's stmatrix row (ds_row): slice kk's blocks 4 kk + m as matrices m; block jj's
  // element (g, 2q | 2q + 1) = codes (key g, key g + 8) of query 2q | 2q + 1, from the low (jj
  // even) or high half of a[kk][2 (jj >> 1)] (key g) and a[kk][2 (jj >> 1) + 1] (key g + 8)
#pragma unroll
  for (int kk = 0; kk < 2; ++kk) {
    slice_afrag_cvt4(v, kk, a[kk]);
    ds_stsm(ds + 4096 * kk, __byte_perm(a[kk][0], a[kk][1], 0x5140), __byte_perm(a[kk][0], a[kk][1], 0x7362),
            __byte_perm(a[kk][2], a[kk][3], 0x5140), __byte_perm(a[kk][2], a[kk][3], 0x7362));
  }
#elif BWD_CVT4
  // the tile's block jj of slice kk: R0 = the low or high half of a[kk][2 (jj >> 1)], R8 of
  // a[kk][2 (jj >> 1) + 1]
#pragma unroll
  for (int kk = 0; kk < 2; ++kk) {
    slice_afrag_cvt4(v, kk, a[kk]);
#pragma unroll
    for (int jj = 0; jj < 4; ++jj) {
      const int sh = 16 * (jj & 1);
      ds_store_block(ds + 1024 * (4 * kk + jj), a[kk][2 * (jj >> 1)] >> sh, a[kk][2 * (jj >> 1) + 1] >> sh);
    }
  }
#else
#pragma unroll
  for (int kk = 0; kk < 2; ++kk) {
    u32 R0[4], R8[4];
    slice_codes(v, kk, R0, R8);
#pragma unroll
    for (int jj = 0; jj < 4; ++jj) ds_store_block(ds + 1024 * (4 * kk + jj), R0[jj], R8[jj]);  // query rows 8J..
#if BWD_QPERM
    codes_to_afrag_perm(R0, R8, a[kk]);
#else
    codes_to_afrag(R0, R8, a[kk]);
#endif
  }
#endif
}

// This thread's byte of the step's dS code tile (dQ's A operand, tile_off<BKT>: row = query, K =
// keys): byte (query 2q, key 64c + 16w + g), core-matrix column 4c + w, row 2q, byte g.
__device__ __forceinline__ u8* ds_byte(BwdV4Smem& sm, const BwdConsumer& C, int buf) {
  return sm.ds[buf] + (4 * C.cw + C.w()) * 128 + 32 * C.qd() + C.g();
}
// BWD_DS_STSM: this lane's row of the step's dS tile for stmatrix: matrix lane / 8 (query block),
// row lane % 8 (query), the warp's core-matrix column 4 cw + w (its 16 keys).
__device__ __forceinline__ u8* ds_row(BwdV4Smem& sm, const BwdConsumer& C, int buf) {
  return sm.ds[buf] + 1024 * (C.lane() >> 3) + (4 * C.cw + C.w()) * 128 + 16 * (C.lane() & 7);
}

// The dQ products' exponents of this warp pair's 32-key block (2 cw + w / 2) in the step's dS
// buffer, written by the pair's even warp: BWD_ROW_DS, per query (this lane's queries 8g + 2q,
// +1); else per 32-query block 0 and 1 (lane 0).
__device__ __forceinline__ void store_ds_exps(BwdV4Smem& sm, const BwdConsumer& C, int buf, int e0, int e1) {
  const int w = C.w(), kb = 2 * C.cw + (w >> 1);
#if BWD_ROW_DS
  if ((w & 1) == 0) {
    sm.dser[buf][8 * C.g() + 2 * C.qd()][kb] = (i8)e0;
    sm.dser[buf][8 * C.g() + 2 * C.qd() + 1][kb] = (i8)e1;
  }
#else
  if (C.lane() == 0 && (w & 1) == 0) {
    sm.dse[buf][0][kb] = e0;
    sm.dse[buf][1][kb] = e1;
  }
#endif
}

#if BWD_ROW_DS
// The two dS copies of `row_ds_exponents` from dS~ in v (this warpgroup's 64 keys x 64 queries):
// - dK's: one exponent per (key row, 32-query slice), over the thread's 8 values and its quad;
//   v is divided by it in place and fkr gets 2^e (applied per slice in FP32 after dK's product).
// - dQ's: one exponent per (query column, 32-key block = this warp pair): column maxima over the
//   thread's two rows, reduce-scattered over the 8 row lanes (lane g, q ends with columns 8g + 2q,
//   +1), the partner warp's through shared memory, gathered back; the codes of v 2^-e go to the
//   step's dS tile and e to dser (the dQ products' scale-in).
__device__ __forceinline__ void row_ds_copies(BwdV4Smem& sm, const BwdConsumer& C, float (&v)[32], int par, int buf,
                                              float (&fkr)[2][2]) {
  const int cw = C.cw, w = C.w(), lane = C.lane(), g = C.g(), q = C.qd();
  int ekr[2][2];
#pragma unroll
  for (int sl = 0; sl < 2; ++sl)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float m = 0.f;
#pragma unroll
      for (int jj = 0; jj < 4; ++jj) {
        const int i = 16 * sl + 4 * jj + 2 * r;
        m = fmaxf(m, fmaxf(fabsf(v[i]), fabsf(v[i + 1])));
      }
      ekr[r][sl] = e4m3_scale_exp_nn(quad_max(m));  // (m from +0 by fmaxf: never NaN)
    }
  // column k = 2j + b is query 8j + 2q + b: max over the rows, then over the row lanes (the first
  // halving straight from v, so only 8 maxima are ever live)
  const auto colmax = [&](int k) { return fmaxf(fabsf(v[4 * (k >> 1) + (k & 1)]), fabsf(v[4 * (k >> 1) + 2 + (k & 1)])); };
  float cm[8];
  {
    const bool up = lane & 16;
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const float lo = colmax(k), hi = colmax(k + 8);
      cm[k] = fmaxf(up ? hi : lo, __shfl_xor_sync(0xffffffffu, up ? lo : hi, 16));
    }
  }
#pragma unroll
  for (int st = 1; st < 3; ++st) {  // lane bit 4 - st of g; keep the half it names
    const int M = 16 >> st, H = 8 >> st;
    const bool up = lane & M;
#pragma unroll
    for (int k = 0; k < H; ++k) {
      const float mine = up ? cm[k + H] : cm[k], give = up ? cm[k] : cm[k + H];
      cm[k] = fmaxf(mine, __shfl_xor_sync(0xffffffffu, give, M));
    }
  }
  // cm[0..1]: this warp's 16 keys' maxima of queries 8g + 2q, +1 (float2 index = lane)
  sm.redc[par][4 * cw + w][lane] = make_float2(cm[0], cm[1]);
  named_sync(2 + 2 * cw + (w >> 1), 64);
  const float2 o = sm.redc[par][4 * cw + (w ^ 1)][lane];
  // (e in [-126, 120]: e4m3_scale_exp's range fits i8; a column of NaN only has a NaN maximum,
  // which fmaxf(x, 0) makes +0: e = -126 either way)
  const int e0 = e4m3_scale_exp_nn(fmaxf(fmaxf(cm[0], o.x), 0.f));
  const int e1 = e4m3_scale_exp_nn(fmaxf(fmaxf(cm[1], o.y), 0.f));
  store_ds_exps(sm, C, buf, e0, e1);
  // every lane's columns' factors back through the warp's own slots (this warp read them last step)
  __syncwarp();
  sm.fcol[4 * cw + w][lane] = make_float2(exp2i_inrange(-e0), exp2i_inrange(-e1));
  __syncwarp();
  // dQ's codes (v 2^-e per column) -> the dS tile (BWD_DS_STSM: as ds_codes, block j's element
  // (g, 2q | 2q + 1) = codes (key g, key g + 8) of query 2q | 2q + 1, one stmatrix.trans per
  // 32-query slice; else the byte stores); then dK's copy in place
  {
    u8* ds = BWD_DS_STSM ? ds_row(sm, C, buf) : ds_byte(sm, C, buf);
#pragma unroll
    for (int kk = 0; kk < 2; ++kk) {
      u32 e[4];
#pragma unroll
      for (int jj = 0; jj < 4; ++jj) {
        const int j = 4 * kk + jj, i = 4 * j;
        const float2 fc = sm.fcol[4 * cw + w][4 * j + q];  // queries 8j + 2q, +1
        if (BWD_DS_STSM) {
          // (keys g, g + 8) of query 2q, then of 2q + 1: written in place by the two conversions
          // (the codes of cvt_e4m3x2's pairs and a byte permute, without their packing: 2 F2FP
          // instead of 2 F2FP + 2 LOP3 + 1 PRMT per block, the same bytes)
          e[jj] = cvt_e4m3x4(v[i] * fc.x, v[i + 2] * fc.x, v[i + 1] * fc.y, v[i + 3] * fc.y);
        } else {
          const u32 R0 = cvt_e4m3x2(v[i] * fc.x, v[i + 1] * fc.y), R8 = cvt_e4m3x2(v[i + 2] * fc.x, v[i + 3] * fc.y);
          ds_store_block(ds + 1024 * j, R0, R8);
        }
      }
      if (BWD_DS_STSM) ds_stsm(ds + 4096 * kk, e[0], e[1], e[2], e[3]);
    }
  }
#pragma unroll
  for (int sl = 0; sl < 2; ++sl)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float f = exp2i_inrange(-ekr[r][sl]);
      fkr[r][sl] = exp2i_inrange(ekr[r][sl]);
#pragma unroll
      for (int jj = 0; jj < 4; ++jj) {
        const int i = 16 * sl + 4 * jj + 2 * r;
        v[i] *= f;
        v[i + 1] *= f;
      }
    }
}
#endif

// A pseudo-random sleep of at most `mask` ns, a hash of (seed, block, site): the test knob
// P.jitter's delays (the reducer's, and the consumers' under BWD_STRESS).
__device__ __forceinline__ void stress_sleep(u32 seed, u32 block, u32 site, u32 mask) {
  u32 x = seed * 0x9E3779B9u ^ block * 0x85EBCA6Bu ^ site * 0xC2B2AE35u;
  x ^= x >> 15;
  x *= 0x2C1B3C6Du;
  __nanosleep((x >> 16) & mask);
}

// acc[64 x N] = A (E4M3 fragments, K slices s0..s0+NS-1) * B^T, B the N = 2R = HEAD_DIM rows of a
// 64-byte-swizzled [N rows x 64 bytes] tile; fresh accumulator, waited for. (Full-width products:
// one round trip per product, R accumulator registers beside the item's 2R of dK and dV.)
template <int NS, int R>
__device__ __forceinline__ void mma_rs_sw64_issue(float (&acc)[R], const u32 (&a)[2][4], u32 b, int s0) {
  const u64 db = desc_sw64(b);
  wg_fence();
#pragma unroll
  for (int kk = 0; kk < NS; ++kk) wgmma_rs_k32_e4m3(acc, a[s0 + kk], desc_add(db, 32 * (s0 + kk)), kk > 0);
  wg_commit();
}
template <int NS, int R>
__device__ __forceinline__ void mma_rs_sw64(float (&acc)[R], const u32 (&a)[2][4], u32 b, int s0) {
  mma_rs_sw64_issue<NS>(acc, a, b, s0);
  wg_wait<0>();
  fence_regs(acc);
}

// The stage's slot is read by this warp (lane 0 arrives for it); BWD_PAIR: in both CTAs' s_empty,
// since either producer's next load of the slot writes into both.
__device__ __forceinline__ void bwd_release_stage(BwdV4Smem& sm, int s, int lane) {
  if (lane == 0) {
    mbar_arrive(smem_u32(&sm.s_empty[s]));
#if BWD_PAIR
    mbar_arrive_remote(mapa_shared(smem_u32(&sm.s_empty[s]), cluster_ctarank() ^ 1));
#endif
  }
}

// One step of a consumer warpgroup: 64 queries against its 64 keys. MASKED: a diagonal step or
// one of a tile that passes the document's end: key row r sees query column c iff r <= c + off
// (causal; off = q0 - k0 - 64c, or 1 << 20 without the causal mask) and r <= lim (the
// warpgroup's last key inside the document).
template <bool MASKED>
__device__ __forceinline__ void bwd_step(const BwdV4Params& P, BwdV4Smem& sm, BwdConsumer& C, const BwdItem& it,
                                         float (&dk)[HEAD_DIM / 2], float (&dv)[HEAD_DIM / 2], int off, int lim) {
  const int cw = C.cw, w = C.w(), lane = C.lane(), qd = C.qd(), s = C.s;
  const int r0 = 16 * w + C.g();  // key row (in the warpgroup's 64) of fragment element 0
  // (masked steps) row r0 + 8r sees the thread's column 8j + 2q + b iff 8j + b >= thr[r]
  int thr[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) thr[r] = r0 + 8 * r <= lim ? r0 + 8 * r - off - 2 * qd : 1 << 20;
  BWD_PHASE(0);
#ifdef BWD_PROF_TIMERS
  const long long _t0 = clock64();
#endif
  bwd_wait(smem_u32(&sm.s_full[s]), C.ph, 1);
#ifdef BWD_PROF_TIMERS
  C.prof[0] += clock64() - _t0;
#endif
#if BWD_FOLD
  // The fold slot of the thread's 32-key block, 2 cw + w / 2: its constants are the products the
  // per-thread fold below makes with row r0's factors (block scales: the block's keys inside the
  // document share them; the producer takes key 32 b's, inside whenever any key of the block is).
  // Keys past the document: their factors are 0 (sm.item), and the per-thread fold multiplies by
  // row r0's, so a thread whose row r0 is past (both rows, as r0 + 8 > r0; masked steps alone)
  // folds with 0, while its block's slot, if the block straddles the document's end, holds the
  // nonzero factors of the block's other keys. Its scores are masked either way (x = -inf, P =
  // +0, P~ = P pc = +0 with pc >= 0), but dS = P fma(dP, A, B) is a signed zero: with factors 0
  // fma(dP, +0, nd * 0) is -0 iff dP and nd are both negative (or -0), with the block's the sign of
  // dP A + B, so the E4M3 codes of those zeros (0x80 / 0x00) could differ. They feed dK of keys
  // past the document (never stored) and the dQ products (exact zeros; a sum's sign could differ
  // only if all its terms are zeros, and dq_acc starts at +0, which absorbs a -0), so no output
  // bit should change; rather than rely on that (and on how the tensor cores sum signed zeros),
  // such a thread reads slot 4, whose constants are the products with the same zero factors as
  // sm.item's (qf * 0, dq * (0 * 0), nd * 0, pe * 0), so every value of every step, the dS
  // codes' sign bits included, is bitwise that of BWD_PRODUCER_FOLD 0. A thread with row r0
  // inside the document and r0 + 8 past it folds with row r0's factors, its block's: slot
  // 2 cw + w / 2.
  const int fb = MASKED && r0 > lim ? BWD_FOLD_SLOTS - 1 : 2 * cw + (w >> 1);
  const float4* fq = &sm.cols[s].qn[fb][qd];  // the thread's column pair of block j: fq[4 * j]
  const float4* fab = &sm.cols[s].ab[fb][qd];
  const float2* fpc = &sm.cols[s].pc[fb][qd];
#else
  const BwdColPair* cp = sm.cols[s].p + qd;  // the thread's column pair of block j: cp[4 * j]
#endif
#if BWD_EARLY_COLS
  // P's first BWD_EARLY_COLS column constants and the keys' factors, loaded while S^T is in the
  // tensor cores (BWD_COLS_FIRST: before its products are issued, so the loads do not queue
  // behind their shared-memory reads; loaded after the wait they queued ~430 clocks, ncu,
  // session 9). j is a constant in the unrolled loops: BWD_COLS picks at compile time.
#if BWD_FOLD
#define BWD_COL(j) fq[4 * (j)]
#else
#define BWD_COL(j) (*reinterpret_cast<const float4*>(&cp[4 * (j)].qf))
#endif
#define BWD_EARLY_LOADS                                                                             \
  float4 cols[BWD_EARLY_COLS];                                                                      \
  _Pragma("unroll") for (int j = 0; j < BWD_EARLY_COLS; ++j) cols[j] = BWD_COL(j);                  \
  BWD_EARLY_KEY_FACTORS
#if BWD_FOLD
#define BWD_EARLY_KEY_FACTORS
#elif BWD_KEY_BLOCKS
#define BWD_EARLY_KEY_FACTORS          \
  const int kr = 64 * cw + r0;         \
  const float kf = lds_volatile(&it.kf[kr]);
#else
#define BWD_EARLY_KEY_FACTORS \
  float kf[2];                \
  _Pragma("unroll") for (int r = 0; r < 2; ++r) kf[r] = lds_volatile(&it.kf[64 * cw + r0 + 8 * r]);
#endif
#define BWD_COLS(j) ((j) < BWD_EARLY_COLS ? cols[(j) < BWD_EARLY_COLS ? (j) : 0] : BWD_COL(j))
#else
#if BWD_FOLD
#define BWD_COLS(j) fq[4 * (j)]
#else
#define BWD_COLS(j) (*reinterpret_cast<const float4*>(&cp[4 * (j)].qf))
#endif
#endif
#if BWD_EARLY_COLS && BWD_COLS_FIRST
  BWD_EARLY_LOADS
#endif
  float sc[32], dp[32];
  {
    // (the four base descriptors in uniform registers, cw being warp-uniform to ptxas: no longer
    // made opaque to keep them out of vector registers, 10 SASS fewer per step; each K slice's
    // is its base plus an offset)
    const u32 kb = smem_u32(sm.k) + 64 * cw * HEAD_DIM, vb = smem_u32(sm.v) + 64 * cw * HEAD_DIM;
    const u32 qb = smem_u32(sm.q[s]), ob = smem_u32(sm.dO[s]);
    const u64 dkb = desc_tok(kb), dvb = desc_tok(vb), dqb = desc_tok(qb), dob = desc_tok(ob);
    wg_fence();
#pragma unroll
    for (int kk = 0; kk < DK_SLICES; ++kk) wgmma_ss_m64n64k32_e4m3(sc, desc_add(dkb, 32 * kk), desc_add(dqb, 32 * kk), kk > 0);
    wg_commit();
#pragma unroll
    for (int kk = 0; kk < DK_SLICES; ++kk) wgmma_ss_m64n64k32_e4m3(dp, desc_add(dvb, 32 * kk), desc_add(dob, 32 * kk), kk > 0);
    wg_commit();
  }
#if BWD_EARLY_COLS && !BWD_COLS_FIRST
  BWD_EARLY_LOADS
#endif
  wg_wait<1>();
  fence_regs(sc);
  BWD_PHASE(1);
#if BWD_KEY_BLOCKS
  // Token-block or tensor-wide scales: the thread's two keys (rows 16w + g, +8) lie in one
  // 32-key block, so 2^eK, 2^eV and 2^-c are one value each and fold into the thread's 16
  // column constants once per step (all powers of two: scaling by them commutes with the
  // rounding, so x, dS~ and P~ are bitwise those of the per-row expressions below while the
  // values stay in the normal range; f32 subnormals, e.g. dO near 2^-110, may round otherwise).
  // Keys past the document, whose factors are 0, are masked instead (masked steps' `lim`).
  // BWD_FOLD: the producer made these products (qk, A, B, pc) per fold slot (fb, above).
#if !BWD_EARLY_COLS && !BWD_FOLD
  const int kr = 64 * cw + r0;
  const float kf = lds_volatile(&it.kf[kr]);
#endif
  // P (into sc) while dP^T is still in the tensor cores: x = s 2^eK qf - LSE log2 e
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const float4 qn = BWD_COLS(j);
#if BWD_FOLD
    const float qk[2] = {qn.x, qn.y}, nl[2] = {qn.z, qn.w};
#else
    const float qk[2] = {qn.x * kf, qn.y * kf}, nl[2] = {qn.z, qn.w};
#endif
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int i = 4 * j + e, r = e >> 1, b = e & 1;
      float x = fmaf(sc[i], qk[b], nl[b]);
      if (MASKED) x = (8 * j + b >= thr[r]) ? x : NEG_INF;
      sc[i] = fast_exp2(x);
    }
  }
  wg_wait<0>();
  fence_regs(dp);
#if !BWD_FOLD
  const float vk = lds_volatile(&it.vf[kr]) * kf, cf = lds_volatile(&it.cf[kr]);
#endif
  // dS~ = P (dP 2^(eV + eK + edO + eQ) - D 2^(eK + eQ)) (into dp) and P~ = P 2^(edO - c) (into sc)
#pragma unroll
  for (int j = 0; j < 8; ++j) {
#if BWD_FOLD
    const float4 ab = fab[4 * j];
    const float2 pf = fpc[4 * j];
    const float A[2] = {ab.x, ab.y}, B[2] = {ab.z, ab.w}, pc[2] = {pf.x, pf.y};
#else
    const float4 dn = *reinterpret_cast<const float4*>(&cp[4 * j].dq);
    const float2 pe = cp[4 * j].pe;
    const float A[2] = {dn.x * vk, dn.y * vk}, B[2] = {dn.z * kf, dn.w * kf}, pc[2] = {pe.x * cf, pe.y * cf};
#endif
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int i = 4 * j + e, b = e & 1;
      const float p = sc[i];
      dp[i] = p * fmaf(dp[i], A[b], B[b]);
      sc[i] = p * pc[b];
    }
  }
#else
  // the item's factors of this thread's two keys, loaded per step (short live ranges)
#if !BWD_EARLY_COLS
  float kf[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) kf[r] = lds_volatile(&it.kf[64 * cw + r0 + 8 * r]);
#endif
  // P (into sc) while dP^T is still in the tensor cores
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const float4 qn = BWD_COLS(j);
    const float qf[2] = {qn.x, qn.y}, nl[2] = {qn.z, qn.w};
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int i = 4 * j + e, r = e >> 1, b = e & 1;
      float x = fmaf(sc[i] * kf[r], qf[b], nl[b]);
      if (MASKED) x = (8 * j + b >= thr[r]) ? x : NEG_INF;
      sc[i] = fast_exp2(x);
    }
  }
  wg_wait<0>();
  fence_regs(dp);
  float vf[2], cf[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int k = 64 * cw + r0 + 8 * r;
    vf[r] = lds_volatile(&it.vf[k]);
    cf[r] = lds_volatile(&it.cf[k]);
  }
  // dS~ (into dp) and P~ = P 2^(edO - c) (into sc)
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const float4 dn = *reinterpret_cast<const float4*>(&cp[4 * j].dq);
    const float2 pe = cp[4 * j].pe;
    const float dq[2] = {dn.x, dn.y}, nd[2] = {dn.z, dn.w}, pf[2] = {pe.x, pe.y};
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int i = 4 * j + e, r = e >> 1, b = e & 1;
      const float p = sc[i];
      const float t = fmaf(dp[i] * vf[r], dq[b], nd[b]);
      dp[i] = (p * kf[r]) * t;
      sc[i] = (p * pf[b]) * cf[r];
    }
  }
#endif
  BWD_PHASE(2);
  const int par = C.nstep & 1, buf = C.nstep % BWD_DS_BUFS;
  u32 ads[2][4], ap[2][4];
  float fk[2][2];           // dK's scale-in 2^e per [query slice][key row r0, r0 + 8]
  dkv_afrag(sc, ap);        // P~ first: its registers are free for dS, and dV may start
#if BWD_DV_EARLY
  // dV's product runs under the dS block maxima and codes (its A fragments ap and accumulator
  // stay untouched until the wait below)
  float dvacc[HEAD_DIM / 2];
  mma_rs_sw64_issue<2>(dvacc, ap, opaque_u32(smem_u32(sm.dOd[s])), 0);
#endif
#if BWD_ROW_DS
  float fkr[2][2];  // dK's copy: 2^e per (key row r, query slice sl)
  row_ds_copies(sm, C, dp, par, buf, fkr);
  BWD_PHASE(3);
  dkv_afrag(dp, ads);  // dK's copy: A fragments only
#pragma unroll
  for (int sl = 0; sl < 2; ++sl) fk[sl][0] = fkr[0][sl], fk[sl][1] = fkr[1][sl];
#else
  // block maxima of dS~: 32 keys (warps 2m, 2m+1 of the warpgroup) x 32 queries (slice)
  float mx[2];
#pragma unroll
  for (int sl = 0; sl < 2; ++sl) {
#if BWD_REDUX
    // a tree (4 dependent FMNMX instead of 16), then +0 in: the chain's result bit for bit (the
    // maximum of the non-NaN |dS~|, +0 if none), so >= +0 and never NaN, as redux needs
    float t[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) t[i] = fmaxf(fabsf(dp[16 * sl + i]), fabsf(dp[16 * sl + i + 8]));
#pragma unroll
    for (int h = 4; h; h >>= 1)
#pragma unroll
      for (int i = 0; i < h; ++i) t[i] = fmaxf(t[i], t[i + h]);
    mx[sl] = warp_max_nonneg(fmaxf(0.f, t[0]));
#else
    float m = 0.f;
#pragma unroll
    for (int i = 16 * sl; i < 16 * sl + 16; ++i) m = fmaxf(m, fabsf(dp[i]));
    mx[sl] = warp_max(m);
#endif
  }
  if (lane == 0) {
    sm.red[par][4 * cw + w][0] = mx[0];
    sm.red[par][4 * cw + w][1] = mx[1];
  }
#ifdef BWD_PROF_TIMERS
  const long long _t1 = clock64();
#endif
  named_sync(2 + 2 * cw + (w >> 1), 64);
#ifdef BWD_PROF_TIMERS
  C.prof[1] += clock64() - _t1;
#endif
  int ex[2];
#pragma unroll
  for (int sl = 0; sl < 2; ++sl) {
    // (e4m3_scale_exp's results lie in [-126, 120]: 2^+-e without exp2i's clamp, 8 VIMNMX fewer
    // per step, here and in the dQ products' scale_in, the same values; BWD_BLOCK_EXP_NN: its
    // three-instruction form, the maxima being never NaN)
    const float bm = fmaxf(mx[sl], sm.red[par][4 * cw + (w ^ 1)][sl]);
    ex[sl] = BWD_BLOCK_EXP_NN ? e4m3_scale_exp_nn(bm) : e4m3_scale_exp(bm);
    const float f = exp2i_inrange(-ex[sl]);
#pragma unroll
    for (int i = 16 * sl; i < 16 * sl + 16; ++i) dp[i] *= f;
    fk[sl][0] = fk[sl][1] = exp2i_inrange(ex[sl]);
  }
  store_ds_exps(sm, C, buf, ex[0], ex[1]);
  BWD_PHASE(3);
  ds_codes(dp, ads, BWD_DS_STSM ? ds_row(sm, C, buf) : ds_byte(sm, C, buf));
#endif
  BWD_PHASE(4);
  // dV += P~^T dO (one chained product over the 64 queries; 2^c applied at the item's end)
#if BWD_DV_EARLY
  wg_wait<0>();
  fence_regs(dvacc);
#pragma unroll
  for (int i = 0; i < HEAD_DIM / 2; ++i) dv[i] += dvacc[i];
#else
  {
    float acc[HEAD_DIM / 2];
    mma_rs_sw64<2>(acc, ap, opaque_u32(smem_u32(sm.dOd[s])), 0);
#pragma unroll
    for (int i = 0; i < HEAD_DIM / 2; ++i) dv[i] += acc[i];
  }
#endif
  BWD_PHASE(5);
  // dK += sum over the two 32-query slices of 2^e (codes^T Q)
#pragma unroll
  for (int sl = 0; sl < 2; ++sl) {
    float acc[HEAD_DIM / 2];
    mma_rs_sw64<1>(acc, ads, opaque_u32(smem_u32(sm.qd[s])), sl);
#pragma unroll
    for (int i = 0; i < HEAD_DIM / 2; ++i) dk[i] = fmaf(acc[i], fk[sl][(i >> 1) & 1], dk[i]);
  }
  BWD_PHASE(6);
  bwd_release_stage(sm, s, lane);
  if (++C.s == BWD_STAGES) { C.s = 0; C.ph ^= 1; }
  // this thread's dS codes (read by wgmma: async proxy) and exponents are written
  fence_async_smem();
  mbar_arrive(smem_u32(&sm.ds_ready[buf]));
  BWD_PHASE(7);
  ++C.nstep;
}
#undef BWD_COLS
#undef BWD_COL
#undef BWD_EARLY_LOADS
#undef BWD_EARLY_KEY_FACTORS

// A step whose 64 keys of this warpgroup see none of its 64 queries (BWD_SKIP_DEAD): nothing
// adds to dK or dV, and the step's dS codes of these keys are zero, so the products and the
// elementwise work are skipped. It keeps every protocol of a full step: it waits for the stage
// and releases it, writes zero codes and exponent 0 (scale 1) into the dS tile and its exponents
// (both warpgroups' dQ products read them), meets its partner warp at the block-maxima barrier
// (the exchange slots alternate by step parity, so each step must pass it once) and arrives on
// ds_ready.
__device__ __forceinline__ void bwd_step_dead(BwdV4Smem& sm, BwdConsumer& C) {
  const int cw = C.cw, w = C.w(), s = C.s, buf = C.nstep % BWD_DS_BUFS;
  bwd_wait(smem_u32(&sm.s_full[s]), C.ph, 2);
#if BWD_DS_STSM
  u8* ds = ds_row(sm, C, buf);
#pragma unroll
  for (int kk = 0; kk < 2; ++kk) ds_stsm(ds + 4096 * kk, 0u, 0u, 0u, 0u);
#else
  u8* ds = ds_byte(sm, C, buf);
#pragma unroll
  for (int j = 0; j < 8; ++j) ds_store_block(ds + 1024 * j, 0u, 0u);
#endif
  store_ds_exps(sm, C, buf, 0, 0);
  named_sync(2 + 2 * cw + (w >> 1), 64);
  bwd_release_stage(sm, s, C.lane());
  if (++C.s == BWD_STAGES) { C.s = 0; C.ph ^= 1; }
  fence_async_smem();
  mbar_arrive(smem_u32(&sm.ds_ready[buf]));
  ++C.nstep;
}

#if BWD_PAIR
// A stage of the pair's walk that this CTA's tile does not see (the lower tile's diagonal query
// tiles, or every stage of an item without an upper tile): waited for and passed on, so the two
// CTAs' rings stay in step. No dS, no dQ (C.nstep unchanged).
__device__ __forceinline__ void bwd_step_pass(BwdV4Smem& sm, BwdConsumer& C) {
  bwd_wait(smem_u32(&sm.s_full[C.s]), C.ph, 3);
  bwd_release_stage(sm, C.s, C.lane());
  if (++C.s == BWD_STAGES) { C.s = 0; C.ph ^= 1; }
}
#endif

// The consumer thread's part of its warpgroup's FP32 dQ partial, into buffer db (BWD_DQ_STSM: by
// stmatrix, each 8-dim block's dims in the order 0, 2, 4, 6, 1, 3, 5, 7; else as follows): row 16w + g + 8r,
// 16-byte chunk (2(j%4) + q/2) XOR g (the 128-byte swizzle: row % 8 = g). Rows g and g ^ 1 of a
// half-warp would write the same 32-byte pair of chunks (2-way bank conflicts on every store:
// ncu, session 9), so odd rows write block j ^ 2 in store j: a half-warp's rows 0..3 then cover
// four different pairs.
template <int NQ>
__device__ __forceinline__ void bwd_dq_store(const BwdV4Params& P, BwdV4Smem& sm, const BwdConsumer& C, int db, int n,
                                             const float (&dq)[NQ]) {
  const int cw = C.cw, w = C.w(), qd = C.qd();
#if BWD_STRESS  // (the delay belongs to the stores: whatever reorders them past the release takes it along)
  if (P.jitter) stress_sleep((u32)P.jitter, (u32)blockIdx.x, (u32)((8 * n + 4 * cw + w) | 1u << 31), 4095);
#else
  (void)P;
  (void)n;
#endif
#if BWD_DQ_STSM
  // lane l: row l & 7 of matrix l >> 3 = (row half r, dim parity b) = (m >> 1, m & 1); block j's
  // matrix m is row 16w + (l & 7) + 8r, 16-byte chunk 2(j % 4) + b (positions 4b .. 4b + 3 of
  // the block: dims 2q + b), swizzled by the row's low three bits: chunk (2(j % 4) + b) ^ (l & 7)
  // = 2(j % 4) ^ (b ^ (l & 7)), so block j's address is block 0's XOR 32(j % 4) (dqs is
  // 1024-byte aligned: the XOR stays inside the 128-byte row)
  (void)qd;
  const int l = C.lane(), m = l >> 3, i = l & 7;
  const u32 a = smem_u32(sm.dqs[db][cw][0]) + (16 * w + i + 8 * (m >> 1)) * 128 + (((m & 1) ^ i) << 4);
#pragma unroll
  for (int j = 0; j < NQ / 4; ++j)
    stsm_x4((a ^ (32u * (j & 3))) + 8192 * (j >> 2), __float_as_uint(dq[4 * j]), __float_as_uint(dq[4 * j + 1]),
            __float_as_uint(dq[4 * j + 2]), __float_as_uint(dq[4 * j + 3]));  // each FP32 as a b16 pair
#else
  u8* base = sm.dqs[db][cw][0] + (16 * w + C.g()) * 128 + 8 * (qd & 1);
  const int sw = 2 * (C.g() & 1);
#pragma unroll
  for (int j = 0; j < NQ / 4; ++j) {
    const int jj = j ^ sw, js = j ^ 2;
    u8* dst = base + 8192 * (j >> 2) + (((2 * (jj & 3) + (qd >> 1)) ^ C.g()) << 4);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float2 v = make_float2(sw ? dq[4 * js + 2 * r] : dq[4 * j + 2 * r], sw ? dq[4 * js + 2 * r + 1] : dq[4 * j + 2 * r + 1]);
      *reinterpret_cast<float2*>(dst + 1024 * r) = v;
    }
  }
#endif
}

#if BWD_PAIR == 2
// The summer's warp w: its own dQ partial is in buffer db (rows 16w.., both 32-dim halves at
// d = 128); once the partner's warp w has stored its own, add the partner's rows in (8 or 4
// 16-byte chunks per lane, all loads in flight first) and release the partner's buffer.
__device__ __forceinline__ void bwd_dq_pair_sum(BwdV4Smem& sm, BwdConsumer& C, int db, u32 rank) {
  const int cw = C.cw, w = C.w();
#if BWD_PAIR_STRICT
  bwd_wait_cluster(smem_u32(&sm.pdq_full[cw][w]), C.npsum & 1, 4);
#else
  bwd_wait(smem_u32(&sm.pdq_full[cw][w]), C.npsum & 1, 4);
#endif
  ++C.npsum;
  constexpr int NC = HEAD_DIM / 64 * 4;  // chunk c: half c / 4, rows 16w + 4 (c % 4) + lane / 8
  u8* mine = sm.dqs[db][cw][0] + 16 * w * 128 + 16 * C.lane();
  const u32 theirs = mapa_shared(smem_u32(mine), rank ^ 1);
#pragma unroll
  for (int h = 0; h < NC / 4; ++h) {  // (four loads in flight at a time: 16 registers)
    float4 o[4];
#pragma unroll
    for (int c = 0; c < 4; ++c) o[c] = ld_shared_cluster_v4(theirs + h * (BQT * 128) + c * 512);
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      float4* p = reinterpret_cast<float4*>(mine + h * (BQT * 128) + c * 512);
      const float4 a = *p;
      *p = make_float4(a.x + o[c].x, a.y + o[c].y, a.z + o[c].z, a.w + o[c].w);
    }
  }
  mbar_arrive_remote(mapa_shared(smem_u32(&sm.dq_empty[db][cw]), rank ^ 1));  // (the loads' values are used above)
}
#endif

// dQ of step n (query tile q0) of a consumer warpgroup: both warpgroups' dS codes of that step
// times this warpgroup's HEAD_DIM / 2 dims of K, handed to the reducer warp. Runs right after the step
// (BWD_DEFER_DQ 0) or after the next step's S..dK (1), so the warpgroups wait for each other's
// dS only when one is a whole step behind, instead of meeting at a barrier every step.
// it: the item's tail (BWD_PAIR 2 reads the pair's flags there, each thread: sm.cur is thread
// 0's and may already hold the next item's while another warp does this item's last dQ).
__device__ __forceinline__ void bwd_dq(const BwdV4Params& P, BwdV4Smem& sm, BwdConsumer& C, int n, int q0,
                                       const BwdItemTail& it) {
  const int cw = C.cw, w = C.w(), qd = C.qd(), buf = n % BWD_DS_BUFS;
#ifdef BWD_PROF_TIMERS
  const long long _t2 = clock64();
#endif
  bwd_wait(smem_u32(&sm.ds_ready[buf]), (n / BWD_DS_BUFS) & 1, 5);
#ifdef BWD_PROF_TIMERS
  C.prof[2] += clock64() - _t2;
#endif
  BWD_PHASE(8);
  constexpr int NQ = HEAD_DIM / 4;  // accumulator registers of m64n{HEAD_DIM / 2}
  float dq[NQ];
  {
    const u32 da = opaque_u32(smem_u32(sm.ds[buf])), kb = smem_u32(sm.kd) + (HEAD_DIM / 2) * cw * BKT;
    const u64 dda = desc_slice<BKT>(da, 0), dkb = desc_sw128(kb);
#ifdef BWD_PROF_NODQ
#pragma unroll
    for (int i = 0; i < NQ; ++i) dq[i] = 0.f;
#else
    // four 32-key slices, two accumulators in flight: slice kk+1's product runs while slice kk
    // is scaled in (2^e differs per 32x32 block, so each slice is a fresh product)
#if BWD_ROW_DS
    const i8* er0 = sm.dser[buf][16 * w + C.g()];  // rows 16w + g and + 8 of the dQ product
    const i8* er8 = sm.dser[buf][16 * w + C.g() + 8];
#else
    const int* e = sm.dse[buf][w >> 1];  // the query block of this thread's rows
#endif
    float ta[NQ], tb[NQ];
    const auto issue = [&](float(&t)[NQ], int kk) {
      wg_fence();
      wgmma_ss_k32_e4m3(t, desc_add(dda, 256 * kk), desc_add(dkb, 32 * kk), 0);
      wg_commit();
    };
    const auto scale_in = [&](float(&t)[NQ], int kk) {  // after the wait for slice kk
      fence_regs(t);
#if BWD_ROW_DS
      const float f[2] = {exp2i_inrange(er0[kk]), exp2i_inrange(er8[kk])};
#else
      const float f[2] = {exp2i_inrange(e[kk]), exp2i_inrange(e[kk])};  // (e4m3_scale_exp's, or a dead step's 0)
#endif
#pragma unroll
      for (int i = 0; i < NQ; ++i) dq[i] = kk ? fmaf(t[i], f[(i >> 1) & 1], dq[i]) : t[i] * f[(i >> 1) & 1];
    };
    issue(ta, 0);
    issue(tb, 1);
    wg_wait<1>();
    scale_in(ta, 0);
    issue(ta, 2);
    wg_wait<1>();
    scale_in(tb, 1);
    issue(tb, 3);
    wg_wait<1>();
    scale_in(ta, 2);
    wg_wait<0>();
    scale_in(tb, 3);
#endif
  }
  BWD_PHASE(9);
  // the buffer is free once the reducer warp's TMA has read this warpgroup's partial before
#ifdef BWD_PROF_TIMERS
  const long long _t3 = clock64();
#endif
  const int db = n % BWD_DQ_BUFS;
  bwd_wait(smem_u32(&sm.dq_empty[db][cw]), ((n / BWD_DQ_BUFS) & 1) ^ 1, 6);
#ifdef BWD_PROF_TIMERS
  C.prof[3] += clock64() - _t3;
#endif
  bwd_dq_store(P, sm, C, db, n, dq);  // (one line: bench/gpu_mutations.sh moves it past the release)
  BWD_PHASE(10);
#if BWD_PAIR == 2
  // paired: the partner's tile sees q0 too (the pair has both tiles; the lower one's query tiles
  // below the upper tile, causal, are its own); the summer: the CTA of rank (q0 / 64) & 1
  const u32 rank = cluster_ctarank();
  const bool paired = it.partner && (rank != 0 || !P.a.causal || q0 >= it.tile.k0 + BKT);
  const bool summer = paired && (u32)((q0 / BQT) & 1) == rank;
  if (paired) {
    __syncwarp();  // (the warp's stmatrix stores, before the lanes' releases and reads)
    if (!summer) {  // the summer takes this partial; the buffer comes back by its release
#if BWD_PAIR_STRICT
      // (the __syncwarp orders the lanes' stores before lane 0's release at cluster scope)
      if (C.lane() == 0) mbar_arrive_cluster(mapa_shared(smem_u32(&sm.pdq_full[cw][C.w()]), rank ^ 1));
#else
      fence_cta();  // (the warp's stores done in this CTA's shared memory before the summer reads them)
      mbar_arrive_remote(mapa_shared(smem_u32(&sm.pdq_full[cw][C.w()]), rank ^ 1));
#endif
      BWD_PHASE(11);
      return;
    }
    bwd_dq_pair_sum(sm, C, db, rank);
  }
#endif
  if (C.t() == 0) {  // the job, before this thread's arrival releases it
    const BwdTile& tl = sm.cur[cw];  // written by this thread at the item's start
    const int h = tl.pad_a;
    BwdDqJob& j = sm.job[db][cw];
    j.h = h - P.h0;  // dq_acc holds the chunk's heads
    j.row = (P.dq_first_store ? tl.pad0 : tl.doc0) + q0;
    j.sem = h * P.nqt + tl.qt0 + q0 / BQT;
    // the partials of the key tiles before this one in the query tile's order (two each): below it
    // (walking down), or above it up to the last that sees the query tile (walking up)
#if BWD_WALK_UP
    j.target = 2 * (tl.up ? q0 / BKT - tl.k0 / BKT : tl.k0 / BKT);
#else
    j.target = 2 * (tl.k0 / BKT);
#endif
#if BWD_PAIR == 2
    // a pair's sum takes the turn of its first tile in the query tile's order (the lower one
    // walking down, the upper one walking up) and counts two key tiles
    if (summer) j.target -= 2 * (tl.up ? 1 - (int)rank : (int)rank);
    j.pad_a = summer ? 2 : 1;
#endif
    j.end = 0;
  }
  // Every thread's stores are made visible to the reducer's TMA (async proxy) and released by its
  // own arrival (dq_full counts the warpgroup's 128): no warpgroup barrier here, so a warp whose
  // stores have drained goes on to the next step instead of waiting for the slowest of the four
  // (the 128-thread barrier and the fence before it were ~8% of the step: ncu, session 9).
  fence_async_smem();
  mbar_arrive(smem_u32(&sm.dq_full[db][cw]));
  BWD_PHASE(11);
}

// Normalised Walsh-Hadamard transform over the N = 2R columns of each row of an m64nN accumulator
// fragment (column 8j + 2q + b: bits b and j inside the thread, q across the quad).
template <int R>
__device__ __forceinline__ void hadamard_frag_rows(float (&d)[R]) {
#pragma unroll
  for (int m = 1; m < R; m <<= 1) {
    if (m == 2) continue;  // element-index bit 1 is the row, not a column bit
#pragma unroll
    for (int i = 0; i < R; ++i) {
      if (i & m) continue;
      const float x = d[i], y = d[i | m];
      d[i] = x + y;
      d[i | m] = x - y;
    }
  }
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int m = 1; m <= 2; m <<= 1) {
    // upper ? o - d : d + o, as one FFMA: fma(-1, d, o) rounds o - d once, fma(1, d, o) d + o
    // (the same bits; a select and an add per element before)
    const float sign = (lane & m) ? -1.f : 1.f;
#pragma unroll
    for (int i = 0; i < R; ++i) {
      const float o = __shfl_xor_sync(0xffffffffu, d[i], m);
      d[i] = fmaf(sign, d[i], o);
    }
  }
#pragma unroll
  for (int i = 0; i < R; ++i) d[i] *= INV_SQRT_HD;
}

#if BWD_BULK
static_assert(2 * 64 * 2 * HEAD_DIM <= BWD_DS_BUFS * BQT * BKT, "BWD_BULK_ST stages both warpgroups' rows in the dS tiles");
// BWD_BULK_ST: this warpgroup's 64 key rows of x (an m64n{HEAD_DIM} FP32 fragment) in BF16 into its
// 16 KB (d = 128) of the dS tiles at `stage`, then its thread 0 sends them to rows tok.. of KV head
// hk by bulk tensor stores (`map`: (HEAD_DIM, Hkv, T) BF16, box (64, 1, 64)). `wait`: thread 0
// then waits until the stores have read the tiles, and barrier 6 + cw holds the warpgroup until
// it has, so the caller may stage again; else the read is the caller's to wait for. `jitter`
// (BWD_STRESS test builds, P.jitter): thread 0 first sleeps a pseudo-random few microseconds, so
// the other warpgroup, which the next item's start holds only by the read's wait (bulk_pending),
// would otherwise write its next dS codes into the tiles before these stores read them.
__device__ __forceinline__ void bwd_box_store(const BwdConsumer& C, u32 stage, const float (&x)[HEAD_DIM / 2], const TmaMap* map,
                                              int hk, int tok, bool wait, int jitter) {
  const float one[2] = {1.f, 1.f};
  stage_frag_bf16_sw128(x, one, stage, C.t(), C.lane());
  fence_async_smem();  // (the generic proxy's writes, before the bulk stores read them)
  const int bar = 6 + C.cw;
  named_sync(bar, 128);
  if (C.t() == 0) {
#if BWD_STRESS
    if (jitter) stress_sleep((u32)jitter, (u32)blockIdx.x, (u32)(tok + C.cw) | 1u << 30, 8191);
#else
    (void)jitter;
#endif
#pragma unroll
    for (int b = 0; b < HEAD_DIM / 64; ++b) tma_store_3d(map, stage + 8192u * b, 64 * b, hk, tok);
    bulk_commit();
    if (wait) bulk_wait_read_all();
  }
  if (wait) named_sync(bar, 128);
}
#endif

// The item's end for one warpgroup: GQA partial sums in head order, then BF16 dK and dV. Returns
// whether it stored them (the group's last head; the same for both warpgroups).
__device__ __forceinline__ bool bwd_item_end(const BwdV4Params& P, BwdV4Smem& sm, const BwdConsumer& C,
                                             const BwdItemTail& it, float (&dk)[HEAD_DIM / 2],
                                             float (&dv)[HEAD_DIM / 2]) {
  const AttnParams& a = P.a;
  const BwdTile& tl = it.tile;
#if defined(BWD_CENSUS_ITEM) && BWD_CENSUS_ITEM == 2  // (census of the MHA path: no GQA sums)
  const int h = it.h, group = 1, hk = h, gi = 0;
#else
  const int h = it.h, group = a.hq / a.hkv, hk = h / group, gi = h - hk * group;
#endif
  // Each head's sums in their final units first (dV's fold c_j is per query head), then the
  // group's heads are added in head order.
  const int r0 = 16 * C.w() + C.g();
  float fk[2], fv[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    fk[r] = it.fk[64 * C.cw + r0 + 8 * r];
    fv[r] = it.fv[64 * C.cw + r0 + 8 * r];
  }
#pragma unroll
  for (int i = 0; i < HEAD_DIM / 2; ++i) {
    dk[i] *= fk[(i >> 1) & 1];
    dv[i] *= fv[(i >> 1) & 1];
  }
  const int bar = 6 + C.cw;
  if (group > 1) {
    int* sem = P.kv_sem + (long long)hk * P.nkt + tl.kt;
    if (C.t() == 0) spin_until(sem, 2 * gi);
    named_sync(bar, 128);
    // [128 threads][dK, dV: HEAD_DIM / 8 float4 each], thread-interleaved (coalesced)
    constexpr int NV4 = HEAD_DIM / 8;
    float4* acc = reinterpret_cast<float4*>(P.dkv_acc + (((long long)tl.kt * P.hkc + (hk - P.hk0)) * 2 + C.cw) * (128 * HEAD_DIM)) + C.t();
    if (gi > 0) {
#pragma unroll
      for (int i = 0; i < NV4; ++i) {
        const float4 x = __ldcg(acc + 128 * i), y = __ldcg(acc + 128 * (NV4 + i));
        dk[4 * i] += x.x; dk[4 * i + 1] += x.y; dk[4 * i + 2] += x.z; dk[4 * i + 3] += x.w;
        dv[4 * i] += y.x; dv[4 * i + 1] += y.y; dv[4 * i + 2] += y.z; dv[4 * i + 3] += y.w;
      }
    }
    if (gi + 1 < group) {
#pragma unroll
      for (int i = 0; i < NV4; ++i) {
        __stcg(acc + 128 * i, make_float4(dk[4 * i], dk[4 * i + 1], dk[4 * i + 2], dk[4 * i + 3]));
        __stcg(acc + 128 * (NV4 + i), make_float4(dv[4 * i], dv[4 * i + 1], dv[4 * i + 2], dv[4 * i + 3]));
      }
      __threadfence();
      named_sync(bar, 128);
      if (C.t() == 0) red_release_add(sem, 1);
      return false;
    }
  }
#ifdef BWD_PROF_NOSTORE  // knock-out: one store per thread (the sums keep the work above alive)
  {
#ifndef BWD_PROF_NOHAD
    if (a.hadamard) hadamard_frag_rows(dk);
#endif
    float x = 0.f;
#pragma unroll
    for (int i = 0; i < HEAD_DIM / 2; ++i) x += dk[i] + dv[i];
    if (x == 1.2345f) a.dk[0] = 0;
    return true;
  }
#endif
  // BF16 out, 16 bytes per store (store_frag_row_bf16: the 4-byte stores of the fragment layout
  // cost ~8,000 clocks per item in partial-sector writes). (dV's stored before dK's Hadamard, to
  // drain under it, measured within noise in session 27 and removed.)
  bool ok[2];
  long long row[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int key = tl.k0 + 64 * C.cw + r0 + 8 * r;
    ok[r] = key < tl.len;
    row[r] = ((long long)(tl.doc0 + (ok[r] ? key : 0)) * a.hkv + hk) * HEAD_DIM;
  }
  const auto store_row = [&](const float(&x)[HEAD_DIM / 2], int r, u16* out) {
#if BWD_ST8
    store_frag_row_bf16_x8(x, r, 1.f, out + row[r], ok[r]);
#else
    store_frag_row_bf16(x, r, 1.f, out + row[r], ok[r]);
#endif
  };
#ifndef BWD_PROF_NOHAD
  if (a.hadamard) hadamard_frag_rows(dk);
#endif
#if BWD_BULK
  // through the dS tiles once both warpgroups' last dQ has read them (barrier 10 over the 256
  // consumer threads): dK, its read waited for, then dV, whose read the next item's start waits
  // for (bwd_consumer); a warpgroup with keys past the document stores from the fragments (below)
  const int nvalid = tl.len - tl.k0 - 64 * C.cw;
  named_sync(10, 256);
  if (nvalid >= 64) {
    const u32 stage = smem_u32(&sm.ds[0][0]) + C.cw * (64 * 2 * HEAD_DIM);
    const int tok = tl.doc0 + tl.k0 + 64 * C.cw;
    bwd_box_store(C, stage, dk, &P.dk_map, hk, tok, true, 0);
    bwd_box_store(C, stage, dv, &P.dv_map, hk, tok, false, P.jitter);
    return true;
  }
#else
  (void)sm;
#endif
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    store_row(dk, r, a.dk);
    store_row(dv, r, a.dv);
  }
  return true;
}

__device__ __forceinline__ void bwd_consumer(const BwdV4Params& P, BwdV4Smem& sm, int cw) {
#ifdef BWD_PROF_TIMERS
  const long long _t_start = clock64();
#endif
  const AttnParams& a = P.a;
  BwdConsumer C;
  C.cw = cw;
  C.s = 0;
  C.ph = 0;
  C.nstep = 0;
#if BWD_PAIR == 2
  C.npsum = 0;
#endif
#ifdef BWD_PROF_PHASES
  C.nitem = 0;
#endif
#ifdef BWD_PROF_TIMERS
  for (int i = 0; i < 6; ++i) C.prof[i] = 0;
#endif
#ifdef BWD_PROF_PHASES
  if (C.t() == 0) {
    for (int i = 0; i < 14; ++i) bwd_phase_clk[cw][i] = 0;
    bwd_phase_last[cw] = clock64();
  }
#endif
#if BWD_BULK
  bool bulk_pending = false;  // the last item's dV boxes may still be reading the dS tiles
#endif
  for (int ni = 0;; ++ni) {
#ifdef BWD_PROF_TIMERS
    const long long _t4 = clock64();
#endif
    bwd_wait(smem_u32(&sm.kv_full), ni & 1, 7);
#ifdef BWD_PROF_TIMERS
    C.prof[4] += clock64() - _t4;
#endif
    BWD_PHASE(13);
    const BwdItemTail& tail = sm.tail[ni % BWD_TAILS];
    if (tail.code < 0) break;
    float dk[HEAD_DIM / 2], dv[HEAD_DIM / 2];
#pragma unroll
    for (int i = 0; i < HEAD_DIM / 2; ++i) dk[i] = dv[i] = 0.f;
#ifdef BWD_CENSUS_ITEM  // (the sums unknown to the compiler, as the steps would leave them)
#pragma unroll
    for (int i = 0; i < HEAD_DIM / 2; ++i) {
      dk[i] = __uint_as_float(opaque_u32((u32)i));
      dv[i] = __uint_as_float(opaque_u32((u32)i + 64u));
    }
#endif
    const BwdTile tl = tail.tile;
#if BWD_PAIR
    const bool own = tail.own;
#endif
#if BWD_KD_XPOSE == 2 && !defined(BWD_PROF_NOXPOSE)
#if BWD_PAIR
    if (own)
#endif
    // this warpgroup's dims of the item's dim-major K, from the K/V slot's token-major tile
    // (published to the first dQ by the first step's fence and ds_ready arrival). The lane and
    // the tiles' addresses opaque: otherwise the compiler hoists the transpose's lane-dependent
    // addresses out of the item loop, and ptxas kept them across the step loops by spilling 6
    // of dK/dV's accumulators per interior step at d = 128 (LDL/STL, `scripts/kernel-regs.py`
    // SASS; 2 with them opaque, 1 without the transpose; none at d = 64 either way).
    xpose_kd_half(sm.k + opaque_u32(0u), sm.kd + opaque_u32(0u), cw, C.w(), tl.len - tl.k0, (int)opaque_u32(C.lane()),
                  BWD_DS_STSM ? XPOSE_ILEAVE : XPOSE_PLAIN);
#elif BWD_KD_XPOSE != 2
    bwd_wait(smem_u32(&sm.kd_full), ni & 1, 8);  // the item's dim-major K (issued before the last item's end)
#endif
#if BWD_VT_XPOSE && !defined(BWD_PROF_NOXPOSE)
    // this warpgroup's 64 keys of the item's token-major V, in place from the dim-major half the
    // producer loaded for it (its loads before its stores: barrier 8 + cw over its 128 threads),
    // published to its first dP product by a proxy fence and the same barrier. Warpgroup, warp
    // and lane opaque, as for K above (with them plain, the interior step loop's LDL/STL went
    // 4 -> 6 at d = 128).
#if BWD_PAIR
    if (own)
#endif
    {
      xpose_vt_half(sm.v + opaque_u32(0u), (int)opaque_u32(cw), (int)opaque_u32(C.w()), (int)opaque_u32(C.lane()), 8 + cw,
                    BWD_VT_VPERM);
      fence_async_smem();
      named_sync(8 + cw, 128);
    }
#endif
#if BWD_BULK
    // the previous item's dV boxes have been read out of the dS tiles (each warpgroup's thread 0
    // waits for its own stores, barrier 10 for both), before this item's first dS codes go there
    if (bulk_pending) {
      if (C.t() == 0) bulk_wait_read_all();
      named_sync(10, 256);
      bulk_pending = false;
    }
#endif
#ifdef BWD_CENSUS_ITEM  // census build (scripts/kernel-regs.py --bwd-per-item): no steps, wrong results
    const int n = 0, qstart = 0;
#elif BWD_PAIR
    const int n = own ? bwd_steps(tl, a.causal) : 0, qstart = a.causal ? tl.k0 : 0;
#else
    const int n = bwd_steps(tl, a.causal), qstart = a.causal ? tl.k0 : 0;
#endif
    // Interior steps: no key past the document and, causal, every key row sees every query.
    // Causal, they never hold a key past the document (a tile's steps from its own first query
    // on are masked, and a partial tile has at most two); without the mask, a partial tile's
    // steps are all masked.
    const int lim = tl.len - 1 - tl.k0 - 64 * cw;  // this warpgroup's last key in the document
#ifdef BWD_CENSUS_ITEM
    const int nint = 0;
#else
    const int nint = a.causal ? max(0, n - 1 - cw) : (lim >= 63 ? n : 0);
#endif
    int pend_q0 = -1;  // query tile of the step whose dQ is still to do (BWD_DEFER_DQ)
    if (C.t() == 0) {
      sm.cur[cw] = tl;
      sm.cur[cw].pad_a = tail.h;
    }
    const auto dq = [&](int step, int q0) { bwd_dq(P, sm, C, step, q0, tail); };
    const auto dq_after_step = [&](int q0) {
      if (!BWD_DEFER_DQ) {
        dq(C.nstep - 1, q0);
        return;
      }
      if (pend_q0 >= 0) dq(C.nstep - 2, pend_q0);
      pend_q0 = q0;
    };
#if BWD_WALK_UP
    // Walking up (tl.up, causal only): the dead steps, the masked ones, then the interior ones
    // from the diagonal up; walking down the reverse, as below. One interior loop for both (its
    // direction a register); the masked and dead loops twice (with one loop of each kind, picked
    // per phase, ptxas spilled 176 B more at d = 128). The #else below repeats the downward part
    // so that the production kernel's PTX stays the measured one (folding the two into one body
    // with `up` constant false reorders its PTX, session 11). The walk is kept (session 12);
    // the #else copy serves launches with no tile walking up (long documents) and goes once the
    // kernel built with BWD_WALK_UP 1 measures the same there (bench/device_s13.sh, walk1).
    const int nmask = n - nint;
    // (at most nmask: BWD_PAIR's CTA without a tile in its pair has no steps, n = 0, so no dead
    // one either; its warpgroup 1 would otherwise take a stage more than its partner's)
    const int ndead = bwd_dead_steps(nmask, lim, a.causal, cw);
    const bool up = tl.up;
    int q0 = up ? qstart : qstart + BQT * (n - 1);
    if (up) {
#if BWD_PAIR  // (walking up, the stages this CTA's tile does not see come first)
      for (int left = tail.pass; left > 0; --left) bwd_step_pass(sm, C);
#endif
      for (int left = ndead; left > 0; --left, q0 += BQT) {
        bwd_step_dead(sm, C);
        dq_after_step(q0);
      }
      for (int left = nmask - ndead; left > 0; --left, q0 += BQT) {
        bwd_step<true>(P, sm, C, sm.item, dk, dv, q0 - tl.k0 - 64 * cw, lim);  // (causal: up)
        dq_after_step(q0);
      }
    }
    const int dir = up ? BQT : -BQT;
    for (int left = nint; left > 0; --left, q0 += dir) {
      bwd_step<false>(P, sm, C, sm.item, dk, dv, 0, 63);
      dq_after_step(q0);
    }
    if (!up) {
      for (int left = nmask - ndead; left > 0; --left, q0 -= BQT) {
        bwd_step<true>(P, sm, C, sm.item, dk, dv, a.causal ? q0 - tl.k0 - 64 * cw : 1 << 20, lim);
        dq_after_step(q0);
      }
      for (int left = ndead; left > 0; --left, q0 -= BQT) {
        bwd_step_dead(sm, C);
        dq_after_step(q0);
      }
#if BWD_PAIR
      for (int left = tail.pass; left > 0; --left) bwd_step_pass(sm, C);
#endif
    }
#else
    // The steps walk the query tiles from the last one down. The loops carry only values that
    // change every step (q0 and a count down to 0): with q0 = qstart + BQT (n - 1 - st) ptxas kept
    // n and qstart in local memory and reloaded both at every step's end, right before their use
    // (~190 clocks per step, ncu, session 9).
    int q0 = qstart + BQT * (n - 1);
    for (int left = nint; left > 0; --left, q0 -= BQT) {
      bwd_step<false>(P, sm, C, sm.item, dk, dv, 0, 63);
      dq_after_step(q0);
    }
    // Dead steps (BWD_SKIP_DEAD), the last ones: no key of this warpgroup in the document (every
    // masked step), or causal, the second warpgroup's step at the tile's first query tile.
    const int nmask = n - nint;
    const int ndead = bwd_dead_steps(nmask, lim, a.causal, cw);
    for (int left = nmask - ndead; left > 0; --left, q0 -= BQT) {
      bwd_step<true>(P, sm, C, sm.item, dk, dv, a.causal ? q0 - tl.k0 - 64 * cw : 1 << 20, lim);
      dq_after_step(q0);
    }
    for (int left = ndead; left > 0; --left, q0 -= BQT) {
      bwd_step_dead(sm, C);
      dq_after_step(q0);
    }
#if BWD_PAIR
    for (int left = tail.pass; left > 0; --left) bwd_step_pass(sm, C);
#endif
#endif
    // the item's K and V are read (each warp's own waits): the producer may load the next item's
    __syncwarp();
    if (C.lane() == 0) mbar_arrive(smem_u32(&sm.kv_empty));
    if (BWD_DEFER_DQ && pend_q0 >= 0) dq(C.nstep - 1, pend_q0);
#if BWD_KD_XPOSE != 2
    // the item's dim-major K is read (each warp's own dQ waits): the producer may load the next
    __syncwarp();
    if (C.lane() == 0) mbar_arrive(smem_u32(&sm.kd_empty));
#endif
#if BWD_PAIR
    if (own)
#endif
#if BWD_BULK
      bulk_pending = bwd_item_end(P, sm, C, tail, dk, dv);
#else
      bwd_item_end(P, sm, C, tail, dk, dv);
#endif
    BWD_PHASE(12);
#ifdef BWD_PROF_PHASES
    ++C.nitem;
#endif
  }
#if BWD_BULK
  if (C.t() == 0) bulk_wait_all();  // (the last item's dK / dV stores done before the CTA leaves)
#endif
  {  // no more partials: the reducer warp finishes the pending ones and stops
    const int db = C.nstep % BWD_DQ_BUFS;
    bwd_wait(smem_u32(&sm.dq_empty[db][cw]), ((C.nstep / BWD_DQ_BUFS) & 1) ^ 1, 9);
    if (C.t() == 0) sm.job[db][cw].end = 1;
    mbar_arrive(smem_u32(&sm.dq_full[db][cw]));  // all 128, as a partial's
  }
#ifdef BWD_PROF_PHASES
  if (C.t() == 0 && blockIdx.x < 2) {
    const long long* k = bwd_phase_clk[cw];
    printf("bwd4 phases cta %d wg %d steps %d clocks/step: wait %lld S %lld ew %lld max %lld codes %lld dV %lld dK %lld "
           "arrive %lld dSwait %lld dQ %lld dQst %lld hand %lld | per item (%d): end %lld wait %lld\n",
           (int)blockIdx.x, cw, C.nstep, k[0] / C.nstep, k[1] / C.nstep, k[2] / C.nstep, k[3] / C.nstep, k[4] / C.nstep,
           k[5] / C.nstep, k[6] / C.nstep, k[7] / C.nstep, k[8] / C.nstep, k[9] / C.nstep, k[10] / C.nstep, k[11] / C.nstep,
           C.nitem, k[12] / max(C.nitem, 1), k[13] / max(C.nitem, 1));
    if (cw == 0) {
      const long long* p = bwd_prod_clk;
      const long long ni = max(p[4], 1ll);
      printf("bwd4 producer cta %d items %lld clocks/item: claim->stage0 %lld (free-stage wait %lld) kv_empty wait %lld "
             "K/V+factors %lld | later stages' free-stage wait %lld\n",
             (int)blockIdx.x, p[4], p[0] / ni, p[1] / ni, p[2] / ni, p[3] / ni, p[5] / ni);
    }
  }
#endif
#ifdef BWD_PROF_TIMERS
  if (C.t() == 0 && blockIdx.x < 2)
    printf("bwd4 prof cta %d wg %d: steps %d clocks %lld | waits: stage %lld pair %lld bar256 %lld dq buffer %lld item %lld\n",
           (int)blockIdx.x, cw, C.nstep, clock64() - _t_start, C.prof[0], C.prof[1], C.prof[2], C.prof[3], C.prof[4]);
#endif
}

// ---- dQ reducer ----------------------------------------------------------------------------
// Lane 0 of producer-warpgroup warp 1 + cw: takes consumer warpgroup cw's dQ partials in step
// order, waits until this (query tile, head)'s semaphore admits them (every earlier key tile has
// added its part: a fixed order, bitwise repeatable), reduce-adds them into dq_acc with TMA, frees
// the buffer once read and bumps the semaphore once landed. The consumers never wait on another
// CTA's progress for dQ, only for their buffer.
// BWD_PROF_REDUCER (profiling builds, bench/device_s12.sh PHASE=prof): CTAs 0-1 print each
// reducer's clocks waiting for a partial, for its semaphore turn, for the TMA's read and for the
// reduce to land.
#ifdef BWD_PROF_REDUCER
#define RED_T(v) const long long v = clock64()
#define RED_ACC(acc, v) acc += clock64() - v
#else
#define RED_T(v)
#define RED_ACC(acc, v)
#endif
__device__ __forceinline__ void bwd_reducer(const BwdV4Params& P, BwdV4Smem& sm, int cw) {
#ifdef BWD_PROF_REDUCER
  const long long t_start = clock64();
  long long w_full = 0, w_sem = 0, w_read = 0, w_land = 0;
#endif
  int k = 0;
  for (;; ++k) {
    const int db = k % BWD_DQ_BUFS;
    RED_T(t0);
    mbar_wait(smem_u32(&sm.dq_full[db][cw]), (k / BWD_DQ_BUFS) & 1);
    RED_ACC(w_full, t0);
    const BwdDqJob j = sm.job[db][cw];
    if (j.end) break;
    int* sem = P.dq_sem + j.sem;
    // tests: the reduces' arrival order changes with the seed, the result must not
    if (P.jitter) stress_sleep((u32)P.jitter, (u32)blockIdx.x, (u32)(2 * k + cw), 8191);
    RED_T(t1);
#ifndef BWD_PROF_NOSEM
    spin_until(sem, j.target);
#endif
    RED_ACC(w_sem, t1);
    fence_async_global();
#ifndef BWD_PROF_NORED
    // the query tile's first partial (turn 0) of these columns is stored, the rest added
    if ((BWD_L2_PROBE & 2) && (k & 1)) {
      // (BWD_L2_PROBE: this partial's reduce left out)
    } else if (P.dq_first_store && j.target == 0) {
#pragma unroll
      for (int half = 0; half < HEAD_DIM / 64; ++half)
        tma_store_3d(&P.dq_map, smem_u32(sm.dqs[db][cw][half]), (HEAD_DIM / 2) * cw + 32 * half, j.h, j.row);
    } else {
#pragma unroll
      for (int half = 0; half < HEAD_DIM / 64; ++half)
        tma_reduce_add_3d(&P.dq_map, smem_u32(sm.dqs[db][cw][half]), (HEAD_DIM / 2) * cw + 32 * half, j.h, j.row);
    }
#endif
    bulk_commit();
    RED_T(t2);
    bulk_wait_read_all();
    RED_ACC(w_read, t2);
#if BWD_PAIR == 2
    mbar_arrive_n(smem_u32(&sm.dq_empty[db][cw]), 128);  // (dq_empty counts the remote summer's 128 lanes)
#else
    mbar_arrive(smem_u32(&sm.dq_empty[db][cw]));
#endif
    RED_T(t3);
    bulk_wait_all();
    RED_ACC(w_land, t3);
    fence_async_global();
#if BWD_PAIR == 2
    red_release_add(sem, j.pad_a);
#else
    red_release_add(sem, 1);
#endif
  }
#ifdef BWD_PROF_REDUCER
  // (printed by a consumer thread at the kernel's end: the build with a printf here, in the
  // producer warpgroup's 24 registers, failed in sessions 12 and 13, in 13 with an illegal
  // instruction; the register cap is the suspect, not confirmed)
  long long* r = sm.redprof[cw];
  r[0] = k, r[1] = clock64() - t_start, r[2] = w_full, r[3] = w_sem, r[4] = w_read, r[5] = w_land;
#else
  (void)k;
#endif
}
#undef RED_T
#undef RED_ACC
#undef PROD_T
#undef PROD_ACC

extern "C" __global__ void __launch_bounds__(384, 1) attn_bwd_v4(const __grid_constant__ BwdV4Params P) {
  extern __shared__ u8 smem_raw[];
  BwdV4Smem& sm = *reinterpret_cast<BwdV4Smem*>(smem_aligned_1024(smem_raw));
  // warp-uniform to ptxas (a __shfl_sync broadcast): the consumers' wgmma descriptors, built
  // from their warpgroup's index, then live in uniform registers (session 25: 1,184 -> 1,120 SASS
  // per interior step at d = 128, the step loops' LDL/STL 10 -> 0; threadIdx-derived, every
  // descriptor went through R2UR per use and ptxas spilled around them)
  const int wg = __shfl_sync(0xffffffffu, threadIdx.x >> 7, 0);
  if (threadIdx.x == 0) {
    mbar_init(smem_u32(&sm.kv_full), 32);
    mbar_init(smem_u32(&sm.kv_empty), 8);
    mbar_init(smem_u32(&sm.kd_full), 1);
    mbar_init(smem_u32(&sm.kd_empty), 8);
    for (int s = 0; s < BWD_STAGES; ++s) {
      mbar_init(smem_u32(&sm.s_full[s]), 32);
      mbar_init(smem_u32(&sm.s_empty[s]), BWD_PAIR ? 16 : 8);  // (BWD_PAIR: both CTAs' consumer warps)
    }
#if BWD_PAIR
    mbar_init(smem_u32(&sm.claim_full), 1);
    mbar_init(smem_u32(&sm.claim_empty), 1);
#endif
#if BWD_PAIR == 2
    for (int c = 0; c < 2; ++c)
      for (int w = 0; w < 4; ++w)  // the partner warp's lane 0 (BWD_PAIR_STRICT), or its lanes
        mbar_init(smem_u32(&sm.pdq_full[c][w]), BWD_PAIR_STRICT ? 1 : 32);
#endif
    for (int b = 0; b < BWD_DS_BUFS; ++b) mbar_init(smem_u32(&sm.ds_ready[b]), 256);
    for (int b = 0; b < BWD_DQ_BUFS; ++b)
      for (int c = 0; c < 2; ++c) {
        mbar_init(smem_u32(&sm.dq_full[b][c]), 128);  // every thread of consumer warpgroup c
        mbar_init(smem_u32(&sm.dq_empty[b][c]), BWD_PAIR == 2 ? 128 : 1);
      }
    mbar_init_fence();
  }
#if BWD_PAIR
  cluster_sync_all();  // (the partner's barriers are initialised before any remote arrival or multicast)
#else
  __syncthreads();
#endif
  pdl_wait();  // (chained launch: bwd_cols' table, the fold exponents, the zeroed semaphores)
  pdl_trigger();
  if (wg == 0) {
    regs_dealloc<24>();
#ifndef BWD_CENSUS_ITEM  // (census builds: the consumers' code alone)
    if (threadIdx.x < 32) bwd_producer(P, sm);
    else if (threadIdx.x == 32 || threadIdx.x == 64) bwd_reducer(P, sm, (threadIdx.x >> 5) - 1);
#endif
  } else {
    regs_alloc<240>();
    bwd_consumer(P, sm, wg - 1);
  }
#if BWD_PAIR
  cluster_sync_all();  // (no CTA leaves while its partner may still arrive on its barriers)
#endif
#ifdef BWD_PROF_REDUCER
  __syncthreads();  // (every thread of the CTA gets here: the reducers' counters are written)
  if (threadIdx.x == 128 && blockIdx.x < 2)
    for (int c = 0; c < 2; ++c) {
      const long long* r = sm.redprof[c];
      printf("bwd4 reducer cta %d wg %d: partials %lld clocks %lld | waits: partial %lld turn %lld read %lld landed %lld\n",
             (int)blockIdx.x, c, r[0], r[1], r[2], r[3], r[4], r[5]);
    }
#endif
}

// BWD_COLS_TMA's table: per (query head, padded position pair) the BwdColPair of the step
// constants, the expressions the producer uses without it (0 / -inf past the document: padding
// rows). One thread per pair. With `keys` (BWD_KEYS_TMA) also each item's BwdKeyRec (the
// producer's key_factors of the item's 128 keys, 0 past the document): 32 more threads per item
// code (key tile * hq + head, the tile of `tiles`), 4 keys each. Mirrors ColsParams in
// src/gpu/attention.rs.
struct ColsParams {
  const i8* q_exp;     // [T, Hq]
  const i8* do_exp;    // [T, Hq]
  const float* lse;    // [T, Hq]
  const float* delta;  // [T, Hq]
  const int* pad_tok;  // [Tpad] the token of each padded position (-1: padding)
  BwdColPair* colc;    // [Hq][Tpad / 2]
  // BWD_KEYS_TMA's records (keys null: none)
  const BwdTile* tiles;  // the backward's key tiles
  BwdKeyRec* keys;       // [nkt * hq]
  const i8* k_exp;       // [T, Hkv]
  const i8* v_exp;       // [T, Hkv]
  const int* cexp;       // [T, Hq] (bwd_dv_fold, the launch before)
  float scale_log2;
  float scale;
  int hq, tpad;
  int hkv, nkt;
};
extern "C" __global__ void __launch_bounds__(256) bwd_cols(const ColsParams p) {
  pdl_wait();  // (chained launch: D and dO's exponents, the dV fold exponents)
  pdl_trigger();
  const long long g = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  const int pairs = p.tpad / 2;
  if (g >= (long long)pairs * p.hq) {
    const long long r = g - (long long)pairs * p.hq;
    if (p.keys == nullptr || r >= (long long)p.nkt * p.hq * 32) return;
    const int code = (int)(r >> 5), lane = (int)(r & 31), tile = code / p.hq, h = code - tile * p.hq;
    const int hk = h / (p.hq / p.hkv);
    const BwdTile t = p.tiles[tile];
    float f[5][4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int key = t.k0 + 4 * lane + j;
      const bool ok = key < t.len;
      float fj[5];
      key_factors(fj, ok, t.doc0, key, h, hk, p.hq, p.hkv, p.k_exp, p.v_exp, p.cexp, p.scale);
#pragma unroll
      for (int k = 0; k < 5; ++k) f[k][j] = fj[k];
    }
    BwdKeyRec& rec = p.keys[code];
    float* dst[5] = {rec.kf, rec.vf, rec.cf, rec.fk, rec.fv};
#pragma unroll
    for (int k = 0; k < 5; ++k)
      reinterpret_cast<float4*>(dst[k])[lane] = make_float4(f[k][0], f[k][1], f[k][2], f[k][3]);
    return;
  }
  const int h = (int)(g / pairs), pr = (int)(g - (long long)h * pairs);
  float c[5][2];
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const int tok = p.pad_tok[2 * pr + j];
    float cj[5];
    step_constants(cj, tok >= 0, (long long)max(tok, 0) * p.hq + h, p.q_exp, p.do_exp, p.lse, p.delta, p.scale_log2);
#pragma unroll
    for (int k = 0; k < 5; ++k) c[k][j] = cj[k];
  }
  BwdColPair& cp = p.colc[(long long)h * pairs + pr];
  *reinterpret_cast<float4*>(&cp.qf) = make_float4(c[0][0], c[0][1], c[1][0], c[1][1]);
  *reinterpret_cast<float4*>(&cp.dq) = make_float4(c[2][0], c[2][1], c[3][0], c[3][1]);
  *reinterpret_cast<float4*>(&cp.pe) = make_float4(c[4][0], c[4][1], 0.f, 0.f);
}

// c_j = max(edO_i over the rows i that see key j) - 8 per (token, query head): the suffix maximum
// over the document (causal) or the document maximum. Integers, so any grouping gives the same
// bits: bwd_dv_fold takes one 1024-thread CTA per (document, head), each thread a contiguous run
// of tokens, the runs' maxima scanned from the right; bwd_dv_fold_warp one warp per (document,
// head), for packings whose documents are all short (the host's choice: attention.rs
// FOLD_WARP_MAX_LEN; 256-token documents took 4,096 CTAs of 1,024 threads, 34 us on an H100).
// Both also zero the fused kernel's semaphores (`sems`, null when the host zeroes them), so no
// memset separates the chained launches. Mirrors DvFoldParams in src/gpu/attention.rs.
struct DvFoldParams {
  const i8* do_exp;  // [T, Hq]
  const int* cu;     // document boundaries (cu_seqlens)
  int* cexp;         // [T, Hq]
  int* sems;         // attn_bwd_v4's semaphores, zeroed by the grid (null: not here)
  int nsems;
  int docs, hq, causal;
};

__device__ __forceinline__ void dv_fold_zero_sems(const DvFoldParams& p) {
  if (p.sems == nullptr) return;
  const int n = (int)(gridDim.x * gridDim.y * blockDim.x);
  for (int i = (int)((blockIdx.y * gridDim.x + blockIdx.x) * blockDim.x + threadIdx.x); i < p.nsems; i += n) p.sems[i] = 0;
}

// A thread's run [b0, b1) of one (document, head)'s dO exponents e (stride hq): its maximum.
__device__ __forceinline__ int fold_run_max(const i8* e, int b0, int b1, int hq) {
  int m = -1000;
  for (int i = b0; i < b1; ++i) m = max(m, (int)e[(long long)i * hq]);
  return m;
}

// max of m over this lane and the lanes above it
__device__ __forceinline__ int warp_suffix_max(int m, int lane) {
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int u = __shfl_down_sync(0xffffffffu, m, o);
    if (lane + o < 32) m = max(m, u);
  }
  return m;
}

// The run's fold exponents into c (stride hq): causal, c_i = max(after, e_j for j >= i) - 8 with
// `after` the maximum past the run (walking the run down); not causal, the document's `all` - 8.
__device__ __forceinline__ void fold_write(const i8* e, int* c, int b0, int b1, int hq, bool causal, int after,
                                           int all) {
  if (!causal) {
    for (int i = b0; i < b1; ++i) c[(long long)i * hq] = all - 8;
    return;
  }
  int run = after;
  for (int i = b1 - 1; i >= b0; --i) {
    run = max(run, (int)e[(long long)i * hq]);
    c[(long long)i * hq] = run - 8;
  }
}

extern "C" __global__ void __launch_bounds__(1024) bwd_dv_fold(const DvFoldParams p) {
  pdl_wait();  // (chained launch: dO's exponents; the previous backward is done with the semaphores)
  pdl_trigger();
  dv_fold_zero_sems(p);
  __shared__ int wmax[32];
  const int d = blockIdx.x, h = blockIdx.y, t = threadIdx.x, lane = t & 31, w = t >> 5, hq = p.hq;
  const int s = p.cu[d], len = p.cu[d + 1] - s;
  const int span = (len + 1023) / 1024, b0 = min(len, t * span), b1 = min(len, b0 + span);
  const i8* e = p.do_exp + (long long)s * hq + h;
  // exclusive suffix max over threads > t (causal) / the document maximum (not causal)
  const int incl = warp_suffix_max(fold_run_max(e, b0, b1, hq), lane);
  if (lane == 0) wmax[w] = incl;
  __syncthreads();
  int after = -1000;  // max over the warps after this one
  for (int v = w + 1; v < 32; ++v) after = max(after, wmax[v]);
  int excl = __shfl_down_sync(0xffffffffu, incl, 1);
  excl = lane == 31 ? after : max(excl, after);
  int all = -1000;
  if (!p.causal)
    for (int v = 0; v < 32; ++v) all = max(all, wmax[v]);
  fold_write(e, p.cexp + (long long)s * hq + h, b0, b1, hq, p.causal, excl, all);
}

extern "C" __global__ void __launch_bounds__(256) bwd_dv_fold_warp(const DvFoldParams p) {
  pdl_wait();  // (as bwd_dv_fold)
  pdl_trigger();
  dv_fold_zero_sems(p);
  const int wid = (int)((blockIdx.x * blockDim.x + threadIdx.x) >> 5), lane = threadIdx.x & 31;
  if (wid >= p.docs * p.hq) return;  // (whole warps)
  const int d = wid / p.hq, h = wid - d * p.hq, hq = p.hq;
  const int s = p.cu[d], len = p.cu[d + 1] - s;
  const int span = (len + 31) / 32, b0 = min(len, lane * span), b1 = min(len, b0 + span);
  const i8* e = p.do_exp + (long long)s * hq + h;
  const int incl = warp_suffix_max(fold_run_max(e, b0, b1, hq), lane);  // over lanes >= lane
  const int all = __shfl_sync(0xffffffffu, incl, 0);
  int run = __shfl_down_sync(0xffffffffu, incl, 1);  // max over lanes > lane
  if (lane == 31) run = -1000;
  fold_write(e, p.cexp + (long long)s * hq + h, b0, b1, hq, p.causal, run, all);
}

// dQ = scale * 2^-eQ * dq_acc (FP32 [T, Hq, HEAD_DIM]), back through the Hadamard transform, in
// BF16. HEAD_DIM / 4 lanes per (token, head) row, 4 values each: 128 / HEAD_DIM rows per warp.
// Mirrors DqConvertParams in src/gpu/attention.rs.
struct DqConvertParams {
  const float* acc;    // [T or Tpad, hc, HEAD_DIM]: the chunk's heads h0..h0 + hc
  const i8* q_exp;     // [T, Hq]
  u16* dq;             // [T, Hq, HEAD_DIM]
  const int* pad_tok;  // null: acc's rows are tokens; else [Tpad] the token of each padded row (-1: padding)
  long long rows;      // T * hc (Tpad * hc with pad_tok)
  float scale;
  int hadamard;
  int hc, hq, h0;
};
#if BWD_DQ_STSM
// hadamard_hd on a row whose lane holds dims 8 (lane / 2) + 2e + (lane & 1) in x[e] (BWD_DQ_STSM):
// the same butterflies in the same dim-bit order (bit 0: lanes ^ 1; bits 1, 2: x[e] pairs; bits
// 3..: lanes ^ 2, ^ 4, ...), each the lower dim's value plus / minus the upper's, so every
// result has hadamard_hd's bits.
__device__ __forceinline__ void hadamard_hd_dq_stsm(float (&x)[4]) {
  const int lane = threadIdx.x & 31;
  const auto across = [&](int m) {
    const bool upper = lane & m;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float o = __shfl_xor_sync(0xffffffffu, x[j], m);
      x[j] = upper ? (o - x[j]) : (x[j] + o);
    }
  };
  across(1);
  float a0 = x[0] + x[1], a1 = x[0] - x[1], a2 = x[2] + x[3], a3 = x[2] - x[3];
  x[0] = a0 + a2; x[1] = a1 + a3; x[2] = a0 - a2; x[3] = a1 - a3;
#pragma unroll
  for (int m = 2; m < HEAD_DIM / 4; m <<= 1) across(m);
#pragma unroll
  for (int j = 0; j < 4; ++j) x[j] *= INV_SQRT_HD;
}
#endif

// One row of the dQ accumulator out: v holds positions 4 lane .. + 3 of the FP32 sum, f its
// scale (scale 2^-eQ); the Hadamard back and BF16 into `row` (HEAD_DIM values) where `ok`.
// Shared by bwd_dq_convert and bwd_dq_follow, so both give the same bits.
__device__ __forceinline__ void dq_row_out(float4 v, float f, int hadamard, u16* row, int lane, bool ok) {
  float x[4] = {v.x * f, v.y * f, v.z * f, v.w * f};
#if BWD_DQ_STSM
  // positions 4 lane .. + 3 hold dims 8 (lane / 2) + 2e + (lane & 1), e = 0..3 (bwd_dq_store's
  // stmatrix order): the Hadamard's stages in hadamard_hd's dim-bit order (bit 0 across lanes
  // ^ 1, bits 1 and 2 inside the thread, bits 3.. across lanes ^ 2, ^ 4, ...), the same sums;
  // then each lane pair trades halves so that a lane holds dims 4 lane .. + 3
  if (hadamard) hadamard_hd_dq_stsm(x);
  const bool odd = lane & 1;
  const float s0 = __shfl_xor_sync(0xffffffffu, odd ? x[0] : x[2], 1);
  const float s1 = __shfl_xor_sync(0xffffffffu, odd ? x[1] : x[3], 1);
  const float y[4] = {odd ? s0 : x[0], odd ? x[2] : s0, odd ? s1 : x[1], odd ? x[3] : s1};
  if (ok) reinterpret_cast<uint2*>(row)[lane] = make_uint2(pack_bf16x2(y[0], y[1]), pack_bf16x2(y[2], y[3]));
#else
  if (hadamard) hadamard_hd(x);
  if (ok) reinterpret_cast<uint2*>(row)[lane] = make_uint2(pack_bf16x2(x[0], x[1]), pack_bf16x2(x[2], x[3]));
#endif
}

// DQC_ROWS (the host defines it: attention.rs dq_convert_rows) rows per thread, each warp's
// rows consecutive: every thread's sums and padded-position lookups go out first, then the
// exponents they point at, then the rows' arithmetic and stores (a row's exponent load cannot
// pass an earlier row's store, which might alias it), so a thread keeps DQC_ROWS 16-byte loads in
// flight where one row per thread waited out two dependent loads with one.
#ifndef DQC_ROWS
#define DQC_ROWS 1
#endif
// DQC_PERSIST 1 (FLAMIA_DQ_CONVERT_CTAS, a measurement knob): a grid of fewer CTAs whose warps
// stride over the rows, so the conversion's rate on a few SMs can be timed: what converter CTAs
// beside the fused backward's workers would move (docs/perf.md "Session 51", Next 3).
#ifndef DQC_PERSIST
#define DQC_PERSIST 0
#endif
extern "C" __global__ void __launch_bounds__(256) bwd_dq_convert(const DqConvertParams p) {
  pdl_wait();  // (chained launch: the fused kernel's dQ accumulator)
  pdl_trigger();
  const float* acc = p.acc;
  const long long rows = p.rows;
  constexpr int LPR = HEAD_DIM / 4;  // lanes per row
  constexpr int RP = 32 / LPR;       // rows per warp and pass
  const long long g = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  const int lane = (int)(g % LPR), sub = (int)((g & 31) / LPR);
  for (long long wi = g >> 5;; wi += (long long)gridDim.x * (blockDim.x >> 5)) {
    const long long w0 = wi * (RP * DQC_ROWS);  // the warp's first row
    if (w0 >= rows) return;  // whole warps only (the shuffles)
    float4 v[DQC_ROWS];
    int tok[DQC_ROWS];
#pragma unroll
    for (int i = 0; i < DQC_ROWS; ++i) {
      const long long r0 = w0 + i * RP + sub, r = r0 < rows ? r0 : rows - 1;
      v[i] = reinterpret_cast<const float4*>(acc + r * HEAD_DIM)[lane];
      tok[i] = p.pad_tok ? p.pad_tok[r / p.hc] : (int)(r / p.hc);
    }
    int e[DQC_ROWS];
#pragma unroll
    for (int i = 0; i < DQC_ROWS; ++i) {
      const long long r0 = w0 + i * RP + sub, r = r0 < rows ? r0 : rows - 1;
      e[i] = p.q_exp[(long long)max(tok[i], 0) * p.hq + p.h0 + r % p.hc];
    }
#pragma unroll
    for (int i = 0; i < DQC_ROWS; ++i) {
      const long long r0 = w0 + i * RP + sub, r = r0 < rows ? r0 : rows - 1;
      const bool ok = r0 < rows && tok[i] >= 0;
      const long long o = (long long)max(tok[i], 0) * p.hq + p.h0 + r % p.hc;  // row of [T, Hq]
      dq_row_out(v[i], p.scale * exp2i(-fold_exp(e[i])), p.hadamard, p.dq + o * HEAD_DIM, lane, ok);
    }
    if (!DQC_PERSIST) return;
  }
}

// ---- dQ converted beside the fused kernel (FLAMIA_BWD_FOLLOWERS) -----------------------------
// bwd_dq_follow: launched right after attn_bwd_v4 with programmatic dependent launch, it runs on
// the SMs the fused kernel's grid leaves free (the host caps that grid) and converts each (query
// head, 64-query tile) of the chunk as soon as the tile's last dQ partial has landed (its
// semaphore at its final count, causal: two partials per key tile that sees it), reading the
// sums from L2, instead of bwd_dq_convert after the fused kernel. A CTA takes units in `units`'
// order (the order in which the fused kernel finishes them: sched.rs BwdSchedule::dq_units),
// thread 0 waits for the unit's count, and the CTA's 256 threads convert its 64 rows with
// bwd_dq_convert's row code (dq_row_out: the same bits). It waits on nothing the fused kernel
// waits on and starts only once every fused CTA has started (PDL), so neither holds the other up
// for good; its pdl_wait at the end makes its completion imply the fused kernel's (dK, dV).
// Needs the padded accumulator (dq_first_store) and a causal plan whose tiles all walk up.
// Mirrors DqFollowParams in src/gpu/attention.rs.
struct DqFollowParams {
  DqConvertParams c;   // rows: padded positions x the chunk's heads h0..h0 + hc
  const int* units;    // [nunits] h_local * nqt + qt (qt: global 64-query tile)
  const int* qtiles;   // int4 per global 64-query tile: doc start, doc length, padded doc start, offset in doc
  const int* sems;     // the fused kernel's dQ semaphores, [Hq][nqt]
  int* counter;        // units taken so far (zeroed with the semaphores by bwd_dv_fold)
  int nunits, nqt;
};
extern "C" __global__ void __launch_bounds__(256) bwd_dq_follow(const DqFollowParams p) {
  constexpr int LPR = HEAD_DIM / 4, RP = 32 / LPR, R = 8 / RP;  // a warp: 8 rows of the tile, RP a pass
  __shared__ int unit;
  const int w = threadIdx.x >> 5, lane = threadIdx.x % LPR, sub = (threadIdx.x & 31) / LPR;
  const int hc = p.c.hc;
  for (;;) {
    if (threadIdx.x == 0) {
      const int u = atomicAdd(p.counter, 1);
      int code = -1;
      if (u < p.nunits) {
        code = p.units[u];
        const int qt = code % p.nqt, hl = code / p.nqt, q0 = p.qtiles[4 * qt + 3];
        spin_until(p.sems + (long long)(p.c.h0 + hl) * p.nqt + qt, 2 * (q0 / BKT + 1));  // (acquire)
      }
      unit = code;
    }
    __syncthreads();  // (thread 0's acquire, before every thread's loads)
    const int code = unit;
    __syncthreads();  // (every thread has read it before thread 0 writes the next)
    if (code < 0) break;
    const int qt = code % p.nqt, hl = code / p.nqt;
    const int doc0 = p.qtiles[4 * qt], len = p.qtiles[4 * qt + 1], pad0 = p.qtiles[4 * qt + 2];
    const int q0 = p.qtiles[4 * qt + 3];
    float4 v[R];
    int e[R];
#pragma unroll
    for (int k = 0; k < R; ++k) {  // every load first (as bwd_dq_convert)
      const int i = (w * R + k) * RP + sub;  // row of the tile
      const long long r = (long long)(pad0 + q0 + i) * hc + hl;
      v[k] = __ldcg(reinterpret_cast<const float4*>(p.c.acc + r * HEAD_DIM) + lane);
      e[k] = p.c.q_exp[(long long)(doc0 + (q0 + i < len ? q0 + i : 0)) * p.c.hq + p.c.h0 + hl];
    }
#pragma unroll
    for (int k = 0; k < R; ++k) {
      const int i = (w * R + k) * RP + sub;
      const bool ok = q0 + i < len;
      const long long o = (long long)(doc0 + (ok ? q0 + i : 0)) * p.c.hq + p.c.h0 + hl;  // row of [T, Hq]
      dq_row_out(v[k], p.c.scale * exp2i(-fold_exp(e[k])), p.c.hadamard, p.c.dq + o * HEAD_DIM, lane, ok);
    }
  }
  pdl_wait();  // (the fused kernel done: whoever waits for this kernel may read dK and dV)
}
