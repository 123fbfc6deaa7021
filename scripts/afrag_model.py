#!/usr/bin/env python3
"""Model of the v4 forward's P packing (attn_fwd_v4.cu p_to_afrag) against V's dim-major order:
each k32 wgmma step of PV must multiply P'[row, key] with V[key, dim] for the same key.
Fragment layouts as ../shared/design/wgmma-fp8-notes.md gives them (verified on the GPU there):
  - the m64nN FP32 accumulator: thread t (warp w = t / 32, g = lane / 4, q = lane % 4) holds
    d[i] = row 16w + g + 8 ((i >> 1) & 1), column 8 (i >> 2) + 2q + (i & 1)  (softmax.cuh);
  - the FP8 A fragment of one k32 slice: byte j of a[r] = row 16w + g + 8 (r & 1),
    K position 16 (r >> 1) + 4q + j  (notes section 4);
  - cvt_e4m3x4(lo0, hi0, lo1, hi1) (attn_common.cuh): bytes lo0, hi0, lo1, hi1 from the low one
    (cvt.rn.satfinite.e4m3x2 puts its first source in the upper byte, notes section 5);
  - the PV product's B operand (V's dim-major tile, 128 keys): K position p of slice kk is V's
    copy position 32 kk + p, which holds key 32 kk + order(p): plain, or DimOrder::QueryPerm
    (quant.cu dim_token) = 16 (p >> 4) + 8 ((p & 3) >> 1) + 2 ((p >> 2) & 3) + (p & 1).
Checks, for the full tile (64 scores a thread) and the half tile (32, FWD_HALF_TILES), that
FWD_VPERM's packing (slice_afrag_cvt4) puts every accumulator element in exactly one A byte and
pairs it with its own key's V row when V's copy is permuted, and that the same packing with the
plain copy (a host that forgot V's order) mismatches, so the check can fail.
Run: python3 scripts/afrag_model.py (no GPU; exit status 1 on a failed check)."""


def qperm(p):
    return 16 * (p >> 4) + 8 * ((p & 3) >> 1) + 2 * ((p >> 2) & 3) + (p & 1)


def acc_col(i, q):
    """Column of accumulator element i of lane q (its row half is (i >> 1) & 1)."""
    return 8 * (i >> 2) + 2 * q + (i & 1)


def vperm_pack(ns, q):
    """slice_afrag_cvt4 over ns scores: {(slice, reg, byte): accumulator element}."""
    out = {}
    for kk in range(ns // 16):
        i = 16 * kk
        regs = [(i + 0, i + 1, i + 4, i + 5), (i + 2, i + 3, i + 6, i + 7),
                (i + 8, i + 9, i + 12, i + 13), (i + 10, i + 11, i + 14, i + 15)]
        for r, srcs in enumerate(regs):
            for j, e in enumerate(srcs):
                out[(kk, r, j)] = e
    return out


def mismatches(ns, pack, order):
    bad = 0
    for lane in range(32):
        q = lane & 3
        for (kk, r, j), e in pack(ns, q).items():
            # the A fragment's row half must be the element's, and its key the B position's key
            if (r & 1) != ((e >> 1) & 1):
                bad += 1
                continue
            pos = 16 * (r >> 1) + 4 * q + j
            key_b = 32 * kk + order(pos)
            key_a = acc_col(e, q)
            bad += key_a != key_b
    return bad


ok = True
for ns in (64, 32):
    good = mismatches(ns, vperm_pack, qperm)
    broken = mismatches(ns, vperm_pack, lambda p: p)
    # every accumulator element packed exactly once
    once = all(sorted(vperm_pack(ns, q).values()) == list(range(ns)) for q in range(4))
    print(f"{ns} scores: FWD_VPERM packing with V's permuted copy: {good} mismatched pairs; "
          f"with the plain copy: {broken} (must be > 0); every element once: {once}")
    ok = ok and good == 0 and broken > 0 and once
raise SystemExit(0 if ok else 1)
