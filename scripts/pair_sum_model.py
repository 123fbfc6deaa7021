#!/usr/bin/env python3
"""Model of attn_bwd_v4.cu's BWD_PAIR 2 pair sum (no GPU): bwd_dq_pair_sum's reads of a dQ partial.

In a paired step the summer's consumer warp w adds its partner's warp w's FP32 dQ partial into its
own buffer: lane l reads 16-byte chunk c (c < HEAD_DIM / 64 * 4) at byte 16 w * 128 + 16 l +
(c / 4) * 8192 + (c % 4) * 512 of its warpgroup's dqs buffer, in its own CTA and, by DSMEM, at the
same offset of the partner's. It may only read what warp w itself stored there (the partner's warp
w signals just its own stores, and the summer's warp w has only synchronised with its own lanes),
and the pair's sum must take every 4-byte word of warp w's rows exactly once. So, per head dim and
per store path of bwd_dq_store (BWD_DQ_STSM 1: stmatrix; 0: byte stores; their address maps are
dq_stsm_model.py's):
1. the words the warp's lanes read are exactly the words its stores wrote, each read by one lane;
2. each 16-byte load instruction's 32 addresses fall into 4 phases of 8 lanes on 8 different
   16-byte chunks of one 128-byte line (no bank conflict).
Each check is also run broken once (another row stride) and must fail then. Run:
python3 scripts/pair_sum_model.py (exit status 1 on any mismatch)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dq_stsm_model as dq  # noqa: E402 (the stores' address maps)

FAILS = []


def warp_words(mem, w):
    """4-byte words of a warpgroup's dqs buffer that warp w's stores wrote."""
    out = set()
    for addr, vals in mem.items():
        rows = {row for row, _dim in vals}
        if all(16 * w <= row < 16 * w + 16 for row in rows):
            out.add(addr)
    return out


def reads(w, nc, row_stride=512):
    """word address -> lanes reading it, and per load instruction the 32 lanes' byte addresses."""
    words, loads = {}, []
    for c in range(nc):
        addrs = []
        for lane in range(32):
            a = 16 * w * 128 + 16 * lane + (c >> 2) * 8192 + (c & 3) * row_stride
            addrs.append(a)
            for k in range(4):
                words.setdefault(a + 4 * k, []).append(lane)
        loads.append(addrs)
    return words, loads


def check(tag, hd, mem, row_stride=512, expect_ok=True):
    nc = hd // 64 * 4
    bad = []
    for w in range(4):
        wrote = warp_words(mem, w)
        words, loads = reads(w, nc, row_stride)
        if set(words) != wrote:
            bad.append(f"warp {w}: reads {len(set(words) - wrote)} words it did not store, "
                       f"misses {len(wrote - set(words))} it did")
        twice = [a for a, lanes in words.items() if len(lanes) != 1]
        if twice:
            bad.append(f"warp {w}: {len(twice)} words read by more than one lane")
        for c, addrs in enumerate(loads):
            for ph in range(4):
                part = addrs[8 * ph: 8 * ph + 8]
                if len({a // 128 for a in part}) != 1 or len({(a % 128) // 16 for a in part}) != 8:
                    bad.append(f"warp {w} chunk {c} phase {ph}: not 8 chunks of one line (bank conflict)")
    if expect_ok and bad:
        FAILS.append(f"{tag}: {bad[0]} ({len(bad)} in all)")
    if not expect_ok and not bad:
        FAILS.append(f"{tag}: the broken reads passed the check")


def main():
    for hd in (128, 64):
        nq = hd // 4  # accumulator registers of m64n{HEAD_DIM / 2}
        for name, mem in (("stmatrix", dq.store_stsm(nq)), ("byte stores", dq.store_bytes(nq))):
            check(f"d = {hd}, {name}", hd, mem)
            check(f"d = {hd}, {name}, broken row stride", hd, mem, row_stride=256, expect_ok=False)
    if dq.FAILS:
        FAILS.extend(dq.FAILS)
    for f in FAILS:
        print("pair_sum_model:", f)
    if FAILS:
        sys.exit(1)
    print("pair_sum_model: the pair sum reads each warp's own partial exactly once, without bank conflicts "
          "(d = 128 and 64, both store paths; the broken reads caught)")


if __name__ == "__main__":
    main()
