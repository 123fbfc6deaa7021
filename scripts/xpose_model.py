#!/usr/bin/env python3
"""Model of xpose.cuh's ldmatrix transposes (xpose_blocks_ldsm): ldmatrix.x4.trans + PRMT +
stmatrix.x4 with the instructions' fragment layouts as the PTX ISA gives them (ldmatrix: lanes
8j..8j+7 give matrix j's row addresses; with .trans lane t holds the transpose's row t/4, 16-bit
columns 2(t%4), +1; stmatrix: lane t's register j is matrix j's row t/4, columns 2(t%4), +1).
Checks bit for bit, with tokens at or past nk zero, and that every matrix's 8 rows hit distinct
bank groups:
  - xpose_kd_half (BWD_KD_XPOSE 2): the same K tile made by both consumer warpgroups' warps, each
    warpgroup its half of the dims, every block exactly once, d = 128 and 64;
  - xpose_vt_half (BWD_VT_XPOSE): the backward's V tile the other way round, each warpgroup its
    64-key half from dim-major (64-byte swizzle) into its token-major rows (the swizzle of d's
    width) in place, its loads before its stores, the two halves in either order (a warpgroup
    that wrote into the other's half would break it), every block once, d = 128 and 64, with the
    dim-major copy in the plain key order and in BWD_QPERM's (BWD_VT_VPERM: each key back in its
    own row; 2-way bank conflicts allowed on those stores);
  - the forward's Q writer (FWD_QD_WRITE): a 128-token tile (token-major, the swizzle of its
    width) into two [d][64-position] tiles with the 64-byte swizzle, plain and BWD_QPERM order,
    d = 128 and 64.
Run: python3 scripts/xpose_model.py (no GPU; exit status 1 on any mismatch)."""
import random

def sw128(r, k): return r * 128 + (k ^ ((r & 7) << 4))
def sw64(r, k): return r * 64 + (k ^ (((r >> 1) & 3) << 4))

def prmt(a, b, sel):
    bs = [(a >> (8 * i)) & 255 for i in range(4)] + [(b >> (8 * i)) & 255 for i in range(4)]
    return sum(bs[(sel >> (4 * i)) & 7] << (8 * i) for i in range(4))

def banks(addrs):
    worst = 0
    for j in range(4):
        bs = {}
        for r in range(8):
            a = addrs[8 * j + r]
            for w in range(4):
                bs.setdefault((a // 4 + w) % 32, set()).add(a // 4 + w)
        worst = max(worst, max(len(v) for v in bs.values()))
    return worst

def blocks(src, dst, soff, doff, x1, x2, y1, y2, nk, perm, rows_qperm=False):
    """xpose_blocks_ldsm for the whole warp (perm: the position order, 0 / False plain, 1 / True
    XPOSE_QPERM, 2 XPOSE_ILEAVE; rows_qperm: xpose_ldsm_store's destination rows in BWD_QPERM's
    order, xpose_vt_half with BWD_VT_VPERM); returns the worst bank ways of its two instructions."""
    la, sa, regs = [0] * 32, [0] * 32, [[0] * 4 for _ in range(32)]
    for t in range(32):
        j, r = t >> 3, t & 7
        kap = r + 8 * (j & 1) if perm else (r & 1) + 4 * (r >> 1) + 2 * (((r >> 2) & 1) ^ (j & 1))
        xa, xb = (x1, x2) if j < 2 else (y1, y2)
        la[t] = soff(16 * xa + kap, 16 * xb)
        rho = 2 * r + (((r >> 2) & 1) ^ (j & 1))
        if rows_qperm:
            rho = 8 * ((rho >> 1) & 1) + 2 * ((rho >> 2) & 3) + (rho & 1)
        sa[t] = doff(16 * xb + rho, 16 * xa)
    for t in range(32):  # ldmatrix .x4 .trans
        q, g = t & 3, t >> 2
        for j in range(4):
            ra, rb = la[8 * j + 2 * q], la[8 * j + 2 * q + 1]
            regs[t][j] = (src[ra + 2 * g] | src[ra + 2 * g + 1] << 8) | (src[rb + 2 * g] | src[rb + 2 * g + 1] << 8) << 16
    out = [[0] * 4 for _ in range(32)]
    for t in range(32):
        q, g = t & 3, t >> 2
        swap = (not perm) and (q >> 1)
        s0, s1 = (0x6240, 0x7351) if perm == 2 else (0x2064, 0x3175) if swap else (0x6420, 0x7531)
        sg = (g >> 2) & 1
        for b in range(2):
            t0 = 16 * (y1 if b else x1) + (2 * q if perm else 4 * q)
            keep = 0
            for c in range(4):
                tok = t0 + ((c >> 1) + 8 * (c & 1) if perm == 2 else (c & 1) + 8 * (c >> 1) if perm else c)
                keep |= (0xff if tok < nk else 0) << (8 * c)
            w0 = prmt(regs[t][2 * b], regs[t][2 * b + 1], s0) & keep
            w1 = prmt(regs[t][2 * b], regs[t][2 * b + 1], s1) & keep
            out[t][2 * b], out[t][2 * b + 1] = (w1, w0) if sg else (w0, w1)
    for t in range(32):  # stmatrix .x4
        q, g = t & 3, t >> 2
        for j in range(4):
            a = sa[8 * j + g] + 4 * q
            for i in range(4):
                dst[a + i] = (out[t][j] >> (8 * i)) & 255
    return max(banks(la), banks(sa))

def qperm(p):  # the token at position p of a 16-position group, BWD_QPERM order
    return (p - p % 16) + 2 * ((p % 16) >> 2) + [0, 1, 8, 9][p % 4]

def ileave(p):  # the token at position p of a 16-position group, XPOSE_ILEAVE order (BWD_DS_STSM)
    return (p - p % 16) + ((p % 16) >> 1) + 8 * (p % 2)

ok = True
def report(what, bad, ways, allowed=1):
    global ok
    print(f"{what}: wrong bytes {bad}, worst bank ways {ways}" + (f" (at most {allowed} expected)" if allowed > 1 else ""))
    ok = ok and bad == 0 and ways <= allowed

for hd, order in ((128, 0), (64, 0), (128, 2), (64, 2)):  # the backward's K by its consumers (xpose_kd_half)
    tok = sw128 if hd == 128 else sw64
    NP, PC = hd // 32, hd // 64
    pos_tok = ileave if order == 2 else (lambda p: p)
    for nk in (128, 100, 65, 1):
        src = [random.randrange(256) for _ in range(128 * hd)]
        dst = [0x7f] * (hd * 128)
        ways, seen = 0, []
        for half in range(2):
            for w in range(4):
                for i in range(NP):
                    p = NP * w + i
                    a, b = p // PC, half * (hd // 32) + 2 * (p % PC)
                    seen += [(a, b), (a, b + 1)]
                    ways = max(ways, blocks(src, dst, tok, sw128, a, b, a, b + 1, nk, order))
        bad = sum((src[tok(pos_tok(p), d)] if pos_tok(p) < nk else 0) != dst[sw128(d, p)] for p in range(128) for d in range(hd))
        bad += len(seen) - len(set(seen))  # every block once
        report(f"K by the consumers d {hd}, nk {nk}{', XPOSE_ILEAVE order' if order == 2 else ''}", bad, ways)

for hd, vperm in ((128, False), (64, False), (128, True), (64, True)):  # the backward's V by its consumers (xpose_vt_half), in place per half
    tok = sw128 if hd == 128 else sw64
    NP = hd // 32
    # vperm (BWD_VT_VPERM): the dim-major copy's position p of each 32-key block holds key qperm(p)
    key_pos = [0] * 128
    for p in range(128):
        key_pos[(qperm(p % 32) + p // 32 * 32) if vperm else p] = p
    for order in ((0, 1), (1, 0)):  # each warpgroup's loads see only what the other left
        # dim-major halves: half c = [hd dims][64 keys], 64-byte swizzle, at byte hd * 64 c
        orig = [random.randrange(256) for _ in range(hd * 128)]
        mem = list(orig)
        ways, seen = 0, []
        for half in order:
            snap = list(mem)  # the warpgroup's barrier: its loads before its stores
            base = half * 64 * hd
            src = lambda r, k, base=base: base + sw64(r, k)
            dst = lambda r, k, base=base: base + tok(r, k)
            for w in range(4):
                for i in range(NP):
                    seen += [(half, 2 * i, w), (half, 2 * i + 1, w)]
                    ways = max(ways, blocks(snap, mem, src, dst, 2 * i, w, 2 * i + 1, w, hd, False, vperm))
        bad = sum(orig[(key_pos[k] // 64) * 64 * hd + sw64(d, key_pos[k] % 64)] != mem[tok(k, d)] for k in range(128) for d in range(hd))
        bad += len(seen) - len(set(seen)) + (len(seen) != 128 * hd // 256)
        # (the permuted rows put two of a matrix's rows on one bank group: 2-way stores, once an item)
        report(f"V by the consumers d {hd}, in place, halves in order {order}{', BWD_VT_VPERM' if vperm else ''}", bad, ways,
               2 if vperm else 1)

for hd in (128, 64):  # the forward's Q writer
    tok = sw128 if hd == 128 else sw64
    for perm in (False, True):
        for nk in (128, 100, 65, 7):
            q = [random.randrange(256) for _ in range(128 * hd)]
            dst = [0x7f] * (2 * hd * 64)
            doff = lambda dim, pos: (pos // 64) * hd * 64 + sw64(dim, pos % 64)
            blk = [(a, b) for a in range(8) for b in range(hd // 16)]
            ways = max(blocks(q, dst, tok, doff, *blk[i], *blk[i + 1], nk, perm) for i in range(0, len(blk), 2))
            bad = 0
            for pos in range(128):
                t = qperm(pos) if perm else pos
                for d in range(hd):
                    want = q[tok(t, d)] if t < nk else 0
                    bad += dst[doff(d, pos)] != want
            report(f"Q writer d {hd} perm {perm} rows {nk}", bad, ways)
raise SystemExit(0 if ok else 1)
