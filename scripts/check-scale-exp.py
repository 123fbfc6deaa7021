#!/usr/bin/env python3
"""Exhaustive check that the branch-free `e4m3_scale_exp` (cuda/attn_common.cuh, session 9) gives
the same exponent as the branchy form it replaced, on all 2^32 f32 bit patterns (a numpy model of
the C of both; ~5 minutes on two cores). Exits 1 on any difference.

    python3 scripts/check-scale-exp.py
"""
import sys

import numpy as np


def branchy(bits):  # if (!(amax > 0)) -126; if (ex == 0) -126; max(-126, ex - 127 - 8 + (mant > 1.75))
    f = bits.view(np.float32)
    ex = ((bits >> 23) & 0xff).astype(np.int64)
    mant = ((bits & 0x7fffff) | (127 << 23)).astype(np.uint32).view(np.float32)
    r = np.maximum(-126, ex - 135 + (mant > np.float32(1.75)).astype(np.int64))
    with np.errstate(invalid="ignore"):
        pos = f > 0
    return np.where(pos & (ex != 0), r, -126)


def branch_free(bits):  # e = (bits >> 23) - 135 + (frac > 0x600000); amax > 0 ? max(-126, e) : -126
    f = bits.view(np.float32)
    e = (bits.view(np.int32) >> 23).astype(np.int64) - 135 + ((bits & 0x7fffff) > 0x600000).astype(np.int64)
    with np.errstate(invalid="ignore"):
        pos = f > 0
    return np.where(pos, np.maximum(-126, e), -126)


def main():
    step, bad = 1 << 26, 0
    for s in range(0, 1 << 32, step):
        b = np.arange(s, s + step, dtype=np.uint64).astype(np.uint32)
        bad += int((branchy(b) != branch_free(b)).sum())
    print(f"e4m3_scale_exp: {bad} differences over all 2^32 inputs")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
