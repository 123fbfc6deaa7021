#!/bin/bash
# Issue 14: the GPU variants of the accuracy and leakage tests must fail when the property they
# guard is broken in the CUDA code. Each mutation below copies flamia-kernels/cuda into a temp
# directory, breaks one thing with sed (the script stops if the pattern is not found), and runs
# the tests that must catch it on that source set (FLAMIA_CUDA_DIR: same binary, kernels compiled
# from the mutated copy). "caught" = the test binary failed, as it must.
# Run on the device from the repo root with the gpu_attention test executable staged by
#   bash bench/device_bwd4.sh --stage        (carry .device-carry/bwd4)
#   bash bench/gpu_mutations.sh              (about 3 minutes; logs under $OUT)
# Locally, `bash bench/gpu_mutations.sh --check` only applies the mutations and compiles them
# with NVRTC (scripts/kernel-regs.py), no GPU; `--patterns` only applies them (scripts/test.sh
# runs it: a kernel change that moves a mutation's pattern fails CI, not the next device call). ONLY=name runs one mutation. SRC=dir mutates another source set (default the
# tree's flamia-kernels/cuda), e.g. the committed sources while the tree holds a kernel variant.
set -u
SRC=${SRC:-flamia-kernels/cuda}
T=${T:-.device-carry/bwd4/gpu_attention}
O=${OUT:-/tmp/flamia-mut}; mkdir -p "$O"
. "$(dirname "$0")/device-env.sh"  # SP, LD_LIBRARY_PATH
check=0; [ "${1:-}" = "--check" ] && check=1
[ "${1:-}" = "--patterns" ] && check=2  # apply only: every pattern still found (scripts/test.sh)
fails=0
mutate() {  # name, file, sed expression, tests...
  local name=$1 file=$2 expr=$3; shift 3
  if [ -n "${ONLY:-}" ] && [ "$name" != "$ONLY" ]; then return 0; fi
  local d="${MUT_SRC:-/tmp/flamia-mut-src}/$name"; rm -rf "$d"; mkdir -p "$d"; cp "$SRC"/*.cu "$SRC"/*.cuh "$d/"
  sed -i "$expr" "$d/$file"
  if cmp -s "$d/$file" "$SRC/$file"; then
    echo "$name: pattern not found in $file (script out of date)"; fails=$((fails + 1)); return 1
  fi
  if [ $check = 2 ]; then rm -rf "$d"; return 0; fi
  if [ $check = 1 ]; then
    local src=$file; [ "${file%.cuh}" != "$file" ] && src=attn_fwd_v4.cu  # a header: compile its user
    python3 scripts/kernel-regs.py --dir "$d" -D MODE=1 "$src" 2>&1 | grep -E "error|Used" | tail -1 | sed "s/^/$name: /"
    return 0
  fi
  for t in "$@"; do
    # BINARY:test runs another staged test binary's test (default gpu_attention)
    local bin=$T
    if [ "${t#*:}" != "$t" ]; then bin=$(dirname $T)/${t%%:*}; t=${t#*:}; fi
    FLAMIA_CUDA_DIR="$d" timeout 120 $bin --ignored --exact "$t" > "$O/$name-$t.log" 2>&1
    local rc=$?
    if [ $rc = 0 ]; then echo "$name / $t: NOT caught (test passed)"; else echo "$name / $t: caught (rc $rc): $(grep -m1 -E 'panicked|exceeds|leak|differs' "$O/$name-$t.log" | cut -c1-160)"; fi
  done
}
# 1. v4 forward: the causal mask of diagonal key tiles dropped (future keys visible).
mutate fwd-no-causal softmax.cuh 's/causal ? min(kval - 1, R + dq) : kval - 1/kval - 1/' \
  causal_leakage_has_the_reference_properties mxfp8_causal_gqa_is_as_accurate_as_the_reference
# 2. v4 backward: the causal mask of the diagonal steps dropped.
mutate bwd4-no-causal attn_bwd_v4.cu 's/? r0 + 8 \* r - off - 2 \* qd : 1 << 20;/? -(1 << 20) : 1 << 20;/' \
  mxfp8_causal_gqa_is_as_accurate_as_the_reference causal_leakage_has_the_reference_properties
# 3. v3.1 backward (runs the causally safe options): row dS exponents ignored (32x32 blocks).
mutate bwd31-block-ds attn_bwd.cu 's/quantise_ds(ds, p.row_ds, /quantise_ds(ds, 0, /' \
  causal_leakage_has_the_reference_properties
# 4. Quantiser: per-token scales replaced by 32-token blocks.
mutate quant-no-per-token quant.cu '1i #undef MODE\n#define MODE 0' \
  causal_leakage_has_the_reference_properties
# 5. v4 backward: dQ partials added in any order (no semaphore wait): bitwise repeatability.
# Both tests run each walk (FLAMIA_BWD_UP_TILES 0 and the default); session 12 saw this mutation
# pass when their 8,192-token document walked up (the default since then), so they force the
# downward walk too, where its 64 key tiles race for the last query tile.
mutate bwd4-unordered-dq attn_bwd_v4.cu '1i #define BWD_PROF_NOSEM' \
  repeated_runs_are_bitwise_identical dq_is_bitwise_the_same_whatever_order_the_reduces_arrive_in
# 6. v4 backward: the dQ partial stored after the arrival that releases it to the reducer's TMA
# (the hand-off's order). Timing alone hides it (session 10: all GPU tests passed); the jitter
# test's stress build (BWD_STRESS) sleeps inside bwd_dq_store, so the reducer reads early.
mutate bwd4-dq-after-release attn_bwd_v4.cu '/^  bwd_dq_store(P, sm, C, db, n, dq);/{h;d};/^  mbar_arrive(smem_u32(&sm.dq_full\[db\]\[cw\]));$/G' \
  dq_is_bitwise_the_same_whatever_order_the_reduces_arrive_in
# 7. v4 backward: a skipped dead step leaves the dS tile's old codes (FLAMIA_BWD_SKIP_DEAD=1 in
# the test builds the skip whatever the source's default).
mutate bwd4-dead-stale-codes attn_bwd_v4.cu 's/ds_store_block(ds + 1024 \* j, 0u, 0u);/(void)j;/' \
  dead_steps_skipped_give_bitwise_the_full_backward
# 8. v4 backward, tiles walking up (FLAMIA_BWD_UP_TILES, set by the test): their dQ partials
# admitted in ascending key-tile order although the host lists their key tiles highest first.
# Any fixed order gives repeatable bits, so only the one-CTA run (FLAMIA_BWD_CTAS=1) sees it: it
# hangs (caught by the timeout, rc 124).
mutate bwd4-up-ascending-turn attn_bwd_v4.cu 's|j.target = 2 \* (tl.up ? q0 / BKT - tl.k0 / BKT : tl.k0 / BKT);|j.target = 2 * (tl.k0 / BKT);|' \
  walking_up_is_accurate_repeatable_and_ordered
# 8b. v4 backward, tiles walking up: from the fourth step on, the producer loads the query tile
# one step behind (a wrong Q / dO for the step the consumers compute). The document of exactly
# BWD_UP_TILES key tiles must then differ between its two walks (session 32's threshold test).
mutate bwd4-up-stage attn_bwd_v4.cu 's|const int q0 = t.up ? qstart + BQT \* st :|const int q0 = t.up ? qstart + BQT * (st > 2 ? st - 1 : st) :|' \
  documents_at_the_walk_threshold_walking_up_agree_with_walking_down
# 9. v4 backward at d = 64, the producer's fold (BWD_PRODUCER_FOLD, the default there since
# session 13): nd folded with 2^(eV+eK) instead of 2^eK. The folded form must stay bitwise the
# per-row one.
mutate bwd4-prodfold-factor attn_bwd_v4.cu 's/c\[3\]\[0\] \* f.x, c\[3\]\[1\] \* f.x);/c[3][0] * f.y, c[3][1] * f.y);/' \
  folded_key_factors_give_bitwise_the_per_row_backward
# 10. v4 backward, the dQ accumulator's first partials stored (the default): the store given to each query tile's
# second partial instead of its first, so the first is added to whatever the accumulator held.
mutate bwd4-dq-store-second attn_bwd_v4.cu 's/if (P.dq_first_store \&\& j.target == 0) {/if (P.dq_first_store \&\& j.target == 2) {/' \
  first_dq_partials_stored_give_bitwise_the_zeroed_accumulator
# 11. Quantiser chunks: the flush no longer zeroes the slots without a block (a document's
# 32-token tail, the layout's last 64 positions), so the poisoned bytes stay there.
mutate quant-chunk-nozero quant.cu 's/if (none) v = make_uint4(0u, 0u, 0u, 0u);//' \
  gpu_quant:quantiser_overwrites_poisoned_buffers_and_repeats_bitwise
# 11b. The same through the flush's fast path (session 34): every chunk taken for full, so a
# chunk with an empty slot stores its stale staging bytes there too.
mutate quant-chunk-allfull quant.cu 's/if ((cb.y | cb.z | cb.w) >= 0) {/if (1) {/' \
  gpu_quant:quantiser_overwrites_poisoned_buffers_and_repeats_bitwise
# 12. Quantiser chunks: every block's codes gathered into slot 0 of the staging buffer.
mutate quant-chunk-slot quant.cu 's/ \^ (32 \* cj);/;/' \
  gpu_quant:e4m3_quantiser_is_bitwise_the_cpu_reference
# 13. BWD_QPERM's packing (the default; FLAMIA_BWD_QPERM=0 turns it off) without the matching
# Q / dO order (the quantiser's permutation dropped): dK and dV pair dS~ / P~ with the wrong
# queries, so the gradients change with the knob.
mutate bwd-qperm-plain-q quant.cu 's/if ((QUANT_PERM_MASK >> it.ti) \& 1) {/if (0) {/' \
  backward_qperm_gives_bitwise_the_same gpu_quant:permuted_dim_copy_is_the_plain_one_reordered_in_every_block
# 14. The forward's token-block producer (the lean one, lanes 0..3 writing each 32-key group's
# exponents): the V exponent of the odd 32-key groups written one too high, so P'V weighs those
# keys' values twice.
mutate fwd-lean-ev attn_fwd_v4.cu 's/sm.ev\[s\]\[FWD_TILE_TRIM ? lane : 32 \* lane\] = ev;/sm.ev[s][FWD_TILE_TRIM ? lane : 32 * lane] = ev + (lane \& 1);/' \
  mxfp8_causal_gqa_is_as_accurate_as_the_reference
# 15. The four-code conversions (BWD_CVT4, the default): the dS tile's second block of each
# register taken from its low half again (the A fragments stay right, so only dQ, which reads the
# tile, goes wrong).
mutate bwd-cvt4-tile-half attn_bwd_v4.cu 's/const int sh = 16 \* (jj \& 1);/const int sh = 0;/' \
  mxfp8_causal_gqa_is_as_accurate_as_the_reference
# 16. The redux block maxima (BWD_REDUX, the default): the tree's first level leaves the thread's
# last value of each slice out, so a block whose maximum lies there gets a smaller exponent (its
# codes and dS scale change with the knob).
mutate bwd-redux-tree attn_bwd_v4.cu 's/fabsf(dp\[16 \* sl + i + 8\])/fabsf(dp[16 * sl + i + (i == 7 ? 0 : 8)])/' \
  backward_redux_maxima_give_bitwise_the_same
# 17. The work counter's self-reset (sched_done) left out: a second launch on the same plan finds
# the counter at its last value, so each CTA takes no item past its first (the forward's poisoned
# O rows stay NaN before the backward runs).
mutate sched-noreset sched.cuh '1i #define SCHED_PROF_NORESET' \
  one_plan_and_workspace_serve_call_after_call
# 18. The semaphores not zeroed by bwd_dv_fold (the memset gone with it): the second backward on
# the same workspace starts from the first one's counts. Expected to hang (a turn that never
# comes): the test's 120 s timeout catches it, so the device scripts leave it out by default.
[ "${HANGS:-0}" = 1 ] && mutate fold-nosems attn_bwd_v4.cu 's/if (p.sems == nullptr) return;/return;/' \
  one_plan_and_workspace_serve_call_after_call
# 19. bwd_dv_fold_warp (documents <= 2,048 tokens): the suffix maximum forgets the later lanes'
# runs, so a key's fold exponent misses the larger dO exponents of later queries (dV's P~ codes
# change against the one-CTA fold, FLAMIA_BWD_FOLD_WARP=0).
mutate fold-warp-suffix attn_bwd_v4.cu 's/  if (lane == 31) run = -1000;/  run = -1000;/' \
  launch_chain_knobs_keep_every_bit
# 20. The ldmatrix transposes' stores (xpose_ldsm_store, every transpose of xpose.cuh; the name is
# from the producer warp's in-place K transpose, removed in session 24): dims 2g take dim 2g + 1's
# byte selector (in every position order; session 26 moved the pattern to session 25's
# order-taking selectors), so the dQ products read K's codes at the wrong dims under the
# consumers' transpose (BWD_KD_XPOSE 2, the test's default).
mutate kd-xpose-inplace xpose.cuh 's/const u32 s0 = order == XPOSE_ILEAVE ? 0x6240u : swap ? 0x2064u : 0x6420u;/const u32 s0 = order == XPOSE_ILEAVE ? 0x7351u : swap ? 0x3175u : 0x7531u;/' \
  dim_major_k_transposed_in_shared_memory_gives_bitwise_the_same
# 21. The ldmatrix transposes (xpose.cuh; the forward's Q copy under FLAMIA_FWD_QD=1, K under
# FLAMIA_BWD_KD_XPOSE=1): tokens past the document not zeroed (the next document's codes land in the
# padding the layout keeps zero: gpu_quant's caller-buffer test checks it with the forward's copy).
mutate qd-fwd-nozero xpose.cuh 's/< nk ? 0xffu : 0u/< (1 << 20) ? 0xffu : 0u/' \
  gpu_quant:quantize_inputs_fills_a_caller_owned_buffer_part_by_part
# 22. The forward's Q copy in plain order where the backward reads the permuted one.
mutate qd-fwd-noperm attn_fwd_v4.cu 's/a, c, a, c + 1, rows, FWD_QD_PERM, lane);/a, c, a, c + 1, rows, false, lane);/' \
  q_dim_major_copy_written_by_the_forward_gives_bitwise_the_same
# 23. The consumers' K transpose (FLAMIA_BWD_KD_XPOSE=2, xpose_kd_half): each warpgroup writes the
# first half of the dims, so the second warpgroup's dQ products read the previous item's rows (or
# zeros) for theirs.
mutate kd-half-dims xpose.cuh 's/return half \* (HEAD_DIM \/ 32) + 2 \* /return 2 * /' \
  dim_major_k_transposed_in_shared_memory_gives_bitwise_the_same
# 24. The consumers' V transpose (BWD_VT_XPOSE, xpose_vt_half): both warpgroups transpose the
# first 64-key half, so the second warpgroup's dP products read untransposed bytes for theirs.
mutate vt-half-keys xpose.cuh 's/u8\* t = v + half \* (64 \* HEAD_DIM);/u8* t = v;/' \
  v_token_major_made_by_the_consumers_gives_bitwise_the_same
# 25. The same transpose without its barrier between the warpgroup's loads and its stores (in
# place, the layouts differ in shape): a race, caught when a warp's stores overtake another
# warp's loads (xpose_model.py shows the bytes it breaks).
mutate vt-no-barrier xpose.cuh 's/^  named_sync(bar, 128);$/  (void)bar;/' \
  v_token_major_made_by_the_consumers_gives_bitwise_the_same
# 26. dK's Hadamard at the item's end with the cross-lane stages' sign the wrong way round (the
# FFMA form of session 25: upper lanes d + o, lower o - d): a wrong rotation of every dK row.
mutate hadamard-sign attn_bwd_v4.cu 's/const float sign = (lane \& m) ? -1.f : 1.f;/const float sign = (lane \& m) ? 1.f : -1.f;/' \
  mxfp8_causal_gqa_is_as_accurate_as_the_reference
# 27. dK and dV's 8-byte stores (BWD_ST8, store_frag_row_bf16_x8) with the two words of each store
# swapped: columns 16k + 2q .. + 3 come out as + 2, + 3, + 0, + 1 (scripts/store_model.py's case).
# (On by default since session 26 for the walk-up and d = 64 builds, which those tests run.)
mutate st8-swap common.cuh 's/const u32 lo = b0 ? v : a, hi = b0 ? b : v;/const u32 hi = b0 ? v : a, lo = b0 ? b : v;/' \
  mxfp8_causal_gqa_is_as_accurate_as_the_reference head_dim_64_is_as_accurate_as_the_reference
# 28. The dS tile by stmatrix (BWD_DS_STSM) with the wrong PRMT for the even query blocks (queries
# 2q and 2q + 1 swapped between the two 16-bit elements): dQ's products pair codes with the wrong queries
# (scripts/store_model.py's case, by a selector). (The host's default since session 26.)
mutate ds-stsm-sel attn_bwd_v4.cu 's/ds_stsm(ds + 4096 \* kk, __byte_perm(a\[kk\]\[0\], a\[kk\]\[1\], 0x5140)/ds_stsm(ds + 4096 * kk, __byte_perm(a[kk][0], a[kk][1], 0x4051)/' \
  mxfp8_causal_gqa_is_as_accurate_as_the_reference head_dim_64_is_as_accurate_as_the_reference
# 29. The quantiser's interleaved dim-major K (QUANT_ILEAVE_MASK, the long documents' operand of
# BWD_DS_STSM) with the token pairs of each group swapped (position 2i token i ^ 1): dQ's products
# pair the dS tile's keys with other keys' K codes.
mutate quant-ileave quant.cu 's/return (r >> 1) + 8 \* (r \& 1);/return ((r >> 1) ^ 1) + 8 * (r \& 1);/' \
  ds_tile_by_stmatrix_gives_bitwise_the_same gpu_quant:permuted_dim_copy_is_the_plain_one_reordered_in_every_block
# 30. The dQ partial by stmatrix (BWD_DQ_STSM, the default since session 27) with each lane's
# matrix address missing its dim-parity chunk (b): both parities' matrices land on one chunk,
# half of every partial lost. 31. Its converter with the lane ^ 1 butterfly after the thread's
# two instead of before (another order of the same sums: other bits, scripts/dq_stsm_model.py's
# broken case).
mutate dq-stsm-addr attn_bwd_v4.cu 's/+ (((m \& 1) ^ i) << 4);/+ (i << 4);/' \
  dq_partials_by_stmatrix_give_bitwise_the_same mxfp8_causal_gqa_is_as_accurate_as_the_reference
mutate dq-stsm-order attn_bwd_v4.cu 's/^  across(1);$/  (void)0;/; s/for (int m = 2; m < HEAD_DIM \/ 4; m <<= 1) across(m);/for (int m = 1; m < HEAD_DIM \/ 4; m <<= 1) across(m);/' \
  dq_partials_by_stmatrix_give_bitwise_the_same
# 32. Row dS's dQ copy by stmatrix (row_ds_copies under BWD_DS_STSM, landed later in session 26)
# with queries 2q and 2q + 1 swapped in every block's element (mutation 28's wrong selector).
# (Since session 37 the two conversions write the stmatrix element in place, cvt_e4m3x4.)
mutate ds-stsm-row attn_bwd_v4.cu 's/e\[jj\] = cvt_e4m3x4(v\[i\] \* fc.x, v\[i + 2\] \* fc.x, v\[i + 1\] \* fc.y, v\[i + 3\] \* fc.y);/e[jj] = cvt_e4m3x4(v[i + 1] * fc.y, v[i + 3] * fc.y, v[i] * fc.x, v[i + 2] * fc.x);/' \
  ds_tile_by_stmatrix_gives_bitwise_the_same precision_options_and_no_hadamard_are_as_accurate_as_the_reference
# 33. The forward's O by bulk tensor stores (FWD_O_TMA, session 30) for a warpgroup with any row in
# the document: its 64-row box writes zeros over the next document's first rows. A race with
# that document's own stores (caught when the box lands last; the three tests give it three
# chances, run it again if it survives).
mutate fwd-o-tma-rows attn_fwd_v4.cu 's/if (64 \* cw + 64 <= rows)/if (64 * cw + 1 <= rows)/' \
  documents_are_isolated_bitwise forward_o_by_tma_gives_bitwise_the_same mxfp8_causal_gqa_is_as_accurate_as_the_reference
# 34. The forward's half tiles (FWD_HALF_TILES, session 30, test under FLAMIA_FWD_HALF=all) for a
# warpgroup whose rows see up to key 95: keys 64..95 of such tiles dropped.
mutate fwd-half-limit attn_fwd_v4.cu 's/if (mk.last(min(64 \* cw + 63, rows - 1)) < 64)/if (mk.last(min(64 * cw + 63, rows - 1)) < 96)/' \
  forward_half_tiles_give_bitwise_the_same
# QUANT_DYN (the test sets FLAMIA_QUANT_DYN=1 itself): the claim counter left as the last launch
# leaves it (a second call claims past the end: items lost), and the loop's claims stepping by two
# (every other item never handed out). (A claim read back from the wrong slot is not among them:
# it lags one claim behind, so a CTA takes one item twice and still every item it claimed.)
mutate quant-dyn-noreset quant.cu 's|  if (tid == 0) sched_done(p.counter);  // (after|  if (false) sched_done(p.counter);  // (after|' \
  gpu_quant:claimed_chunk_items_give_bitwise_the_grid_stride_shares
mutate quant-dyn-skip quant.cu 's|^        if (tid == 0) claim = (int)gridDim.x + atomicAdd(p.counter, 1);|        if (tid == 0) claim = (int)gridDim.x + atomicAdd(p.counter, 2);|' \
  gpu_quant:claimed_chunk_items_give_bitwise_the_grid_stride_shares
# 35. The backward's CTA pairs (session 36, BWD_PAIR; the tests set FLAMIA_BWD_PAIR themselves):
# rank 1 keeps the pair's lower tile instead of taking the upper one (the upper tile's dK / dV
# never written, the lower one's dQ added twice: no hang, the semaphore counts stay whole).
mutate bwd4-pair-upper-tile attn_bwd_v4.cu 's/        if (rank != 0 \&\& both) t = tu;/        (void)tu;/' \
  cta_pairs_give_bitwise_the_unpaired_backward
# 36. Mode 2 (the pair's dQ partials summed through DSMEM): the summer reads its partner's
# partial without waiting for its store, and (37) reads its own buffer instead of the partner's
# (its partial counted twice, the partner's never).
mutate bwd4-pairsum-nowait attn_bwd_v4.cu 's/  bwd_wait_cluster(smem_u32(&sm.pdq_full\[cw\]\[w\]), C.npsum & 1, 4);/  (void)0;/' \
  cta_pair_sums_are_accurate_repeatable_isolated_and_ordered
mutate bwd4-pairsum-self attn_bwd_v4.cu 's/const u32 theirs = mapa_shared(smem_u32(mine), rank ^ 1);/const u32 theirs = mapa_shared(smem_u32(mine), rank);/' \
  cta_pair_sums_are_accurate_repeatable_isolated_and_ordered
# 38. The forward's P packed for V's permuted copy (FWD_VPERM, session 40, FLAMIA_FWD_VPERM=1)
# with the backward's V transpose not putting the keys back (BWD_VT_VPERM's rows kept in place):
# dP pairs dO with other keys' V codes. 39. The quantiser writing V's copy in the plain order
# while the forward packs for the permuted one (P' meets other keys' V codes; the backward's V
# transpose then permutes a plain tile too). (Not yet run on a GPU: no device after session 40's
# build.)
mutate fwd-vperm-vt-rows xpose.cuh 's/const int rho = rows_qperm ? /const int rho = false ? /' \
  forward_vperm_gives_bitwise_the_same
mutate fwd-vperm-plain-v quant.cu 's/if ((QUANT_PERM_MASK >> it.ti) \& 1) {/if (((QUANT_PERM_MASK >> it.ti) \& 1) \&\& it.ti != 2) {/' \
  forward_vperm_gives_bitwise_the_same
# 40. The forward's K-slice descriptors by one add (FWD_DESC_ADD, session 40, FLAMIA_FWD_DESC_ADD=1)
# stepping 16 bytes a slice instead of 32: S and PV read overlapping halves of the K slices.
mutate fwd-desc-add-step attn_fwd_v4.cu 's/return FWD_DESC_ADD ? desc_add(DESC(tile), 32 \* kk)/return FWD_DESC_ADD ? desc_add(DESC(tile), 16 * kk)/' \
  forward_slice_descriptors_by_add_give_bitwise_the_same
# 41. FWD_TILE_TRIM's compact group tables (session 40, FLAMIA_FWD_TILE_TRIM=1) with the producer
# still writing each group's exponents at key 32 G: the consumers read three stale groups.
mutate fwd-trim-tables attn_fwd_v4.cu 's/sm.kf\[s\]\[FWD_TILE_TRIM ? lane : 32 \* lane\] = kf;/sm.kf[s][32 * lane] = kf;/' \
  forward_tile_trims_give_bitwise_the_same
# 42. FWD_TILE_TRIM's interior maximum taken as it is (its first version, found by a review):
# a row whose scaled scores all overflow to -inf on its first tile gets exp2(NaN) and a NaN row
# (the test's overflowing row), where the default gives the finite output of its later tiles.
mutate fwd-trim-mref softmax.cuh 's/mref\[r\] = FINITE ? fmaxf(mn, -3.402823466e38f) : /mref[r] = FINITE ? mn : /' \
  forward_tile_trims_give_bitwise_the_same
# 43. FWD_EV_RUN's running maximum started at 0 instead of "no group seen": every row's V fold
# reference is then at least 0 (eV of N(0,1) blocks is about -6), P' six binades smaller, other
# bits where the running maximum (the default since session 43) and FLAMIA_FWD_EV_RUN=0's per-tile
# reference must agree (every V block with one exponent).
mutate fwd-ev-run-init attn_fwd_v4.cu 's/st.evo\[r\] = FWD_EV_RUN ? -1000 : 0;/st.evo[r] = 0;/' \
  forward_ev_running_max_keeps_uniform_exponents_bitwise
# 44. BWD_KEYS_TMA's records (session 44) with each query head's KV head taken as h mod Hkv instead
# of h / group: heads 1 and 2 of the tests' four (two KV heads) read the other KV head's K and V
# exponents, so their factors, and the gradients, differ from the producer's own (FLAMIA_BWD_KEYS_TMA=0).
mutate bwd4-keys-kv-head attn_bwd_v4.cu 's/    const int hk = h \/ (p.hq \/ p.hkv);/    const int hk = h % p.hkv;/' \
  key_factors_by_bulk_copy_give_bitwise_the_same
# 45. (BWD_KV_EARLY's early release; the knob measured no faster and was removed in session 45)
# 46. BWD_BULK_ST (FLAMIA_BWD_BULK_ST=1; session 45's bulk tensor stores) with dV's boxes sent to
# KV head 0 whatever the item's KV head: with two KV heads, head 1's dV lands on head 0's rows.
mutate bwd4-bulk-dv-head attn_bwd_v4.cu 's/bwd_box_store(C, stage, dv, &P.dv_map, hk, tok, false, P.jitter);/bwd_box_store(C, stage, dv, \&P.dv_map, 0, tok, false, P.jitter);/' \
  dk_dv_by_bulk_copies_give_bitwise_the_same
# 47. BWD_BULK_ST without the next item's wait for dV's boxes to be read (bulk_pending): the other
# warpgroup may write its next dS codes into the staging tiles before the stores read them. The
# stress build (FLAMIA_BWD_JITTER) delays the dV stores' issue by up to ~8 us to expose it.
mutate bwd4-bulk-no-start-wait attn_bwd_v4.cu 's/^    if (bulk_pending) {$/    if (false) {/' \
  dq_is_bitwise_the_same_whatever_order_the_reduces_arrive_in
# (48, qflags-nowait, went with the quantiser beside the forward in session 50.)
[ $check = 2 ] && [ $fails = 0 ] && echo "gpu_mutations.sh: every mutation's pattern found"
exit $((fails > 0))
