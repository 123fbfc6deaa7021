#!/usr/bin/env python3
"""Model of common.cuh's BF16 row stores of an m64nN FP32 accumulator fragment, checked against
the fragment layout (thread q = lane & 3 of a quad holds x[4j + 2r + c] = row r's column
8j + 2q + c): each store routine, applied to one quad, must write every column of the row exactly
once, with that column's value, and every store must be one whole aligned piece.
  - store_frag_row_bf16 (16-byte stores after quad_transpose: two butterfly rounds, lanes ^ 1 and
    ^ 2, words chosen by q's bits);
  - store_frag_row_bf16_x8 (8-byte stores after one exchange with lane ^ 1 per pair of 8-column
    blocks: an even q keeps block 2k's word and takes its partner's, an odd q block 2k + 1's;
    addresses 2q + (q odd ? 6 : 0) + 16k BF16 from the row's start);
  - and, to show the check can fail, the 8-byte routine with its two words swapped;
  - attn_bwd_v4's dS tile for dQ from the four-code registers: by byte stores (ds_store_block,
    keys in order) and by PRMT + stmatrix.trans (BWD_DS_STSM: keys 0, 8, 1, 9, ... in each
    16-key group, the order xpose_model.py checks K's dim-major tile in).
N = 128 and 64 (R = 64 and 32 floats per thread). Run: python3 scripts/store_model.py (no GPU;
exit status 1 on any mismatch)."""
import random
import sys


def word(q, j, r):  # the BF16 pair packed from x[4j + 2r], x[4j + 2r + 1] of thread q
    return ((r, 8 * j + 2 * q), (r, 8 * j + 2 * q + 1))


def st16(R, r):
    out = []  # (first column, width in columns, values)
    for J in range(R // 16):
        w = {q: [word(q, 4 * J + jj, r) for jj in range(4)] for q in range(4)}
        for m, pairs in ((1, (0, 2)), (2, (0, 1))):  # quad_transpose's two rounds
            for p in pairs:
                send = {q: (w[q][p] if q & m else w[q][p + m]) for q in range(4)}
                for q in range(4):
                    if q & m:
                        w[q][p] = send[q ^ m]
                    else:
                        w[q][p + m] = send[q ^ m]
        for q in range(4):
            out.append((8 * (4 * J + q), 8, [v for wd in w[q] for v in wd]))
    return out


def st8(R, r, swapped=False):
    out = []
    for k in range(R // 8):
        a = {q: word(q, 2 * k, r) for q in range(4)}
        b = {q: word(q, 2 * k + 1, r) for q in range(4)}
        send = {q: (a[q] if q & 1 else b[q]) for q in range(4)}
        for q in range(4):
            v = send[q ^ 1]
            lo, hi = (v, b[q]) if q & 1 else (a[q], v)
            if swapped:
                lo, hi = hi, lo
            out.append((2 * q + (6 if q & 1 else 0) + 16 * k, 4, list(lo) + list(hi)))
    return out


def check(stores, R, r):
    seen = {}
    for col, width, vals in stores:
        if (2 * col) % (2 * width) != 0:  # byte offset a multiple of the store's size
            return f"store at column {col} of {2 * width} bytes is misaligned"
        for i, v in enumerate(vals):
            seen.setdefault(col + i, []).append(v)
    want = {c: [(r, c)] for c in range(2 * R)}
    if seen != want:
        bad = sorted(c for c in set(seen) | set(want) if seen.get(c) != want.get(c))
        return f"columns {bad[:6]}... wrong or missing"
    return None


def prmt(a, b, sel):
    bs = [(a >> (8 * i)) & 255 for i in range(4)] + [(b >> (8 * i)) & 255 for i in range(4)]
    return sum(bs[(sel >> (4 * i)) & 7] << (8 * i) for i in range(4))


def ds_tile(code, stsm):
    """One warp's 16 keys of attn_bwd_v4's dS tile for dQ (8 query blocks of [8 queries][16 bytes]):
    thread (g, q) holds keys g and g + 8 of queries 8j + 2q, +1 (the m64n64 fragment), packed by
    slice_afrag_cvt4 (a[0] / a[1]: keys g / g + 8, blocks 4kk and 4kk + 1 in the low / high half;
    a[2] / a[3]: blocks 4kk + 2, + 3); stored by ds_store_block (4 bytes) or, BWD_DS_STSM, by one
    PRMT per block and stmatrix.m8n8.x4.trans.b16 per slice (lane 8m + r gives matrix m's row r)."""
    tile = [[[None] * 16 for _ in range(8)] for _ in range(8)]  # [block][query row][byte]
    for t in range(32):
        g, q = t >> 2, t & 3
        for kk in range(2):
            a = []
            for pair in ((4 * kk, g), (4 * kk, g + 8), (4 * kk + 2, g), (4 * kk + 2, g + 8)):
                j0, k = pair
                a.append(code[k][8 * j0 + 2 * q] | code[k][8 * j0 + 2 * q + 1] << 8
                         | code[k][8 * (j0 + 1) + 2 * q] << 16 | code[k][8 * (j0 + 1) + 2 * q + 1] << 24)
            if stsm:
                regs = [prmt(a[0], a[1], 0x5140), prmt(a[0], a[1], 0x7362), prmt(a[2], a[3], 0x5140), prmt(a[2], a[3], 0x7362)]
                for m in range(4):  # .trans: element (g, 2q + h) goes to row 2q + h, element g
                    for h in range(2):
                        e = (regs[m] >> (16 * h)) & 0xffff
                        tile[4 * kk + m][2 * q + h][2 * g] = e & 255
                        tile[4 * kk + m][2 * q + h][2 * g + 1] = e >> 8
            else:
                for jj in range(4):
                    sh = 16 * (jj & 1)
                    r0, r8 = a[2 * (jj >> 1)] >> sh, a[2 * (jj >> 1) + 1] >> sh
                    blk = tile[4 * kk + jj]  # ds_store_block: d[0], d[16], d[8], d[24]
                    blk[2 * q][g], blk[2 * q + 1][g] = r0 & 255, (r0 >> 8) & 255
                    blk[2 * q][g + 8], blk[2 * q + 1][g + 8] = r8 & 255, (r8 >> 8) & 255
    return tile


fails = 0
code = [[random.randrange(256) for _ in range(64)] for _ in range(16)]  # [key][query]
for stsm, key_at in ((False, lambda p: p), (True, lambda p: (p >> 1) + 8 * (p & 1))):
    tile = ds_tile(code, stsm)
    bad = sum(tile[j][r][p] != code[key_at(p)][8 * j + r] for j in range(8) for r in range(8) for p in range(16))
    if bad:
        fails += 1
        print(f"dS tile ({'stmatrix' if stsm else 'byte stores'}): {bad} wrong bytes")
bad = sum(ds_tile(code, True)[j][r][p] != code[p][8 * j + r] for j in range(8) for r in range(8) for p in range(16))
if bad == 0:
    fails += 1
    print("the stmatrix dS tile matched the plain key order (the check cannot tell the orders apart)")
for R in (64, 32):
    for r in (0, 1):
        for name, stores in (("store_frag_row_bf16", st16(R, r)), ("store_frag_row_bf16_x8", st8(R, r))):
            err = check(stores, R, r)
            if err:
                fails += 1
                print(f"{name} N={2 * R} row {r}: {err}")
        if check(st8(R, r, swapped=True), R, r) is None:
            fails += 1
            print(f"N={2 * R}: the swapped 8-byte routine passed (the check cannot fail)")
print("store_model: " + ("ok" if not fails else f"{fails} failures") +
      " (16- and 8-byte BF16 row stores, N = 128 and 64, both fragment rows; the dS tile by byte"
      " stores and by stmatrix in XPOSE_ILEAVE key order)")
sys.exit(1 if fails else 0)
