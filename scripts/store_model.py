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
  - and, to show the check can fail, the 8-byte routine with its two words swapped.
N = 128 and 64 (R = 64 and 32 floats per thread). Run: python3 scripts/store_model.py (no GPU;
exit status 1 on any mismatch)."""
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


fails = 0
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
      " (16- and 8-byte BF16 row stores, N = 128 and 64, both fragment rows)")
sys.exit(1 if fails else 0)
