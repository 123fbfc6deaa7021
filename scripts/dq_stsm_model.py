#!/usr/bin/env python3
"""Model of attn_bwd_v4.cu's BWD_DQ_STSM (no GPU): the FP32 dQ partial stored by stmatrix, and
bwd_dq_convert reading it back.

1. bwd_dq_store: each consumer warp's stores into one dqs buffer ([HEAD_DIM / 64 halves][64 rows]
   [128 bytes], the TMA's 128-byte swizzle: 16-byte chunk c of row r lies at chunk c ^ (r % 8)).
   The m64nN accumulator fragment: thread (g, q) = (lane / 4, lane % 4) holds x[4j + 2r + b] =
   row g + 8r, dim 8j + 2q + b of its warp's 16 rows. The byte-store path (BWD_DQ_STSM 0, its odd
   rows storing block j ^ 2 in store j) must give every position its own dim (the plain order);
   the stmatrix path (lane l: row l % 8 of matrix l / 8 = (r, b); thread (g, q) supplies row g,
   4-byte column q of each matrix) must give position 8k + 4b + q of each half dim 8k + 2q + b.
   Every position written once, and every stmatrix matrix's 8 rows on 8 different chunks (one
   shared-memory wavefront per matrix).
2. bwd_dq_convert: lane L of a row reads positions 4L .. 4L + 3; with BWD_DQ_STSM those hold dims
   8(L / 2) + 2e + (L % 2), and hadamard_hd_dq_stsm takes the butterflies in hadamard_hd's
   dim-bit order before the lane pairs trade halves. Both are run in float32 arithmetic (each sum
   rounded to float32) on random rows: every output dim must have the plain path's bits.
Each check is also run broken once (a wrong stmatrix address, the butterflies in another order)
and must fail then. HEAD_DIM 128 and 64. Run: python3 scripts/dq_stsm_model.py (exit status 1 on
any mismatch)."""
import random
import struct
import sys

ROWS = 64  # BQT: query rows of a partial
FAILS = []


def fail(msg):
    FAILS.append(msg)


def f32(x):
    return struct.unpack("f", struct.pack("f", x))[0]


def frag(w, lane, i):  # (row, dim) of a warp's lane's accumulator value x[i] (dims of one warpgroup)
    g, q = lane >> 2, lane & 3
    j, r, b = i >> 2, (i >> 1) & 1, i & 1
    return (16 * w + g + 8 * r, 8 * j + 2 * q + b)


def unswizzle(addr):  # byte address in a warpgroup's dqs -> (half, row, logical 4-byte position)
    half, off = divmod(addr, 8192)
    row, byte = divmod(off, 128)
    chunk = (byte >> 4) ^ (row & 7)
    return half, row, 4 * chunk + ((byte & 15) >> 2)


def store_bytes(nq):  # BWD_DQ_STSM 0: address -> (row, dim)
    mem = {}
    for w in range(4):
        for lane in range(32):
            g, qd = lane >> 2, lane & 3
            base = (16 * w + g) * 128 + 8 * (qd & 1)
            sw = 2 * (g & 1)
            for j in range(nq // 4):
                jj, js = j ^ sw, j ^ 2
                dst = base + 8192 * (j >> 2) + (((2 * (jj & 3) + (qd >> 1)) ^ g) << 4)
                for r in range(2):
                    src = 4 * js + 2 * r if sw else 4 * j + 2 * r
                    for e in range(2):
                        mem.setdefault(dst + 1024 * r + 4 * e, []).append(frag(w, lane, src + e))
    return mem


def store_stsm(nq, broken=False):  # BWD_DQ_STSM 1: address -> (row, dim); also the bank check
    mem = {}
    for w in range(4):
        for j in range(nq // 4):
            rows_of = {}
            for lane in range(32):  # lane l: the row address of matrix l >> 3, row l & 7
                m, i = lane >> 3, lane & 7
                a = (16 * w + i + 8 * (m >> 1)) * 128 + ((((0 if broken else m & 1)) ^ i) << 4)
                rows_of[(m, i)] = (a ^ (32 * (j & 3))) + 8192 * (j >> 2)
            for m in range(4):
                chunks = {(rows_of[(m, i)] % 128) >> 4 for i in range(8)}
                if len(chunks) != 8:
                    fail(f"stmatrix: warp {w} block {j} matrix {m} rows on {len(chunks)} chunks (bank conflict)")
            for lane in range(32):  # thread (g, q): row g, 4-byte column q of each matrix
                g, q = lane >> 2, lane & 3
                for m in range(4):
                    mem.setdefault(rows_of[(m, g)] + 4 * q, []).append(frag(w, lane, 4 * j + m))
    return mem


def check_store(tag, mem, nq, order, expect_ok=True):
    dims = nq * 2  # a warpgroup's dims: HEAD_DIM / 2
    bad = []
    seen = set()
    for addr, vals in mem.items():
        half, row, p = unswizzle(addr)
        if len(vals) != 1:
            bad.append(f"{addr}: written {len(vals)} times")
            continue
        want = (row, 32 * half + order(p))
        if vals[0] != want:
            bad.append(f"position {32 * half + p} of row {row} holds {vals[0]}, wants {want}")
        seen.add((row, 32 * half + p))
    if len(seen) != ROWS * dims:
        bad.append(f"{ROWS * dims - len(seen)} positions never written")
    if expect_ok and bad:
        fail(f"{tag}: {bad[0]} ({len(bad)} in all)")
    if not expect_ok and not bad:
        fail(f"{tag}: the broken store passed the check")


def stsm_order(p):  # position p of a half -> dim (each 8-dim block: 0, 2, 4, 6, 1, 3, 5, 7)
    return 8 * (p >> 3) + 2 * (p & 3) + ((p >> 2) & 1)


def hadamard_plain(rowv, hd):  # hadamard_hd: lane L holds dims 4L + e
    lanes = hd // 4
    x = [[rowv[4 * L + e] for e in range(4)] for L in range(lanes)]
    x = [inthread(xl) for xl in x]
    m = 1
    while m < lanes:
        x = across(x, m)
        m <<= 1
    inv = f32(1.0 / hd ** 0.5)
    out = [None] * hd
    for L in range(lanes):
        for e in range(4):
            out[4 * L + e] = f32(x[L][e] * inv)
    return out


def inthread(a):  # a thread's two butterflies over x[e], e's bit 0 then bit 1 (hadamard_hd's first lines)
    a0, a1, a2, a3 = f32(a[0] + a[1]), f32(a[0] - a[1]), f32(a[2] + a[3]), f32(a[2] - a[3])
    return [f32(a0 + a2), f32(a1 + a3), f32(a0 - a2), f32(a1 - a3)]


def across(x, m):
    new = []
    for L in range(len(x)):
        o = x[L ^ m]
        new.append([f32(o[j] - x[L][j]) if L & m else f32(x[L][j] + o[j]) for j in range(4)])
    return new


def hadamard_stsm(rowv, hd, broken=False):  # bwd_dq_convert with BWD_DQ_STSM: positions 4L + e
    lanes = hd // 4
    x = [[rowv[4 * L + e] for e in range(4)] for L in range(lanes)]  # dims 8(L/2) + 2e + L%2
    if not broken:
        x = across(x, 1)
    x = [inthread(xl) for xl in x]
    if broken:  # the lane ^ 1 butterfly after the thread's (another order of the same sums)
        x = across(x, 1)
    m = 2
    while m < lanes:
        x = across(x, m)
        m <<= 1
    inv = f32(1.0 / hd ** 0.5)
    x = [[f32(v * inv) for v in xl] for xl in x]
    out = [None] * hd
    for L in range(lanes):  # the lane pair's trade: s0, s1 from lane L ^ 1
        odd = L & 1
        p = x[L ^ 1]
        # the partner sends its x[0], x[1] if it is odd, else its x[2], x[3]
        s0, s1 = (p[0], p[1]) if odd == 0 else (p[2], p[3])
        y = [s0, x[L][2], s1, x[L][3]] if odd else [x[L][0], s0, x[L][1], s1]
        for e in range(4):
            out[4 * L + e] = y[e]
    return out


def check_convert(hd, rng):
    diffs_broken = 0
    for trial in range(200):
        dims = [f32(rng.uniform(-1, 1) * 2.0 ** rng.randint(-20, 20)) for _ in range(hd)]
        # dq_acc as stored with BWD_DQ_STSM: position p holds dim stsm_order(p) (halves of 32
        # positions per warpgroup half; the order is per 8-dim block, so the same over the row)
        stored = [dims[stsm_order(p)] for p in range(hd)]
        want = hadamard_plain(dims, hd)
        got = hadamard_stsm(stored, hd)
        if got != want:
            bad = sum(1 for a, b in zip(got, want) if a != b)
            fail(f"convert d={hd}: {bad} of {hd} dims differ from hadamard_hd's bits (trial {trial})")
            return
        if hadamard_stsm(stored, hd, broken=True) != want:
            diffs_broken += 1
    if diffs_broken == 0:
        fail(f"convert d={hd}: the butterflies in another order gave the same bits on every row")


def main():
    rng = random.Random(26)
    for hd in (128, 64):
        nq = hd // 4  # accumulator registers of m64n{hd / 2}
        check_store(f"byte stores d={hd}", store_bytes(nq), nq, lambda p: p)
        check_store(f"stmatrix d={hd}", store_stsm(nq), nq, stsm_order)
        check_store(f"stmatrix d={hd} broken", store_stsm(nq, broken=True), nq, stsm_order, expect_ok=False)
        check_convert(hd, rng)
    if FAILS:
        for f in FAILS:
            print("FAIL", f)
        sys.exit(1)
    print("dq_stsm_model: stores (plain and stmatrix), banks and the converter's bits agree, d = 128 and 64")


if __name__ == "__main__":
    main()
