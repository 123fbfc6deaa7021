#!/usr/bin/env python3
"""A timing model of the v4 backward's schedule (no GPU): does the work list, the walk direction or
the moment a CTA claims its next item explain a slowdown, before any device time is spent on it?

Model (cuda/attn_bwd_v4.cu, src/gpu/sched.rs): items are (128-key tile, query head) in the
BwdSchedule order (longest first, or with the upward walk a document's key tiles highest first
after the rest); a persistent CTA runs one item at a time, one 64-query step per T; each step's dQ
partial is handed to the CTA's reducer one step later (deferred dQ), into one buffer (a hand-off
waits until the reducer has read the previous partial, r after admitting it); the reducer admits a
partial once its query tile's semaphore has the earlier key tiles' (the list order per query tile),
and releases the semaphore L after admitting; an item ends E after its last hand-off. A CTA claims
its next item either when it starts its current one (the kernel through session 11) or about
three steps before the current one ends (BWD_LATE_CLAIM). No memory system, no per-step
variation: what it shows is the schedule's own cost.

    python3 bench/sched_model.py                      # the table of session 11 (docs/perf.md)
    python3 bench/sched_model.py --workload 16x4096 --L 3
"""
import argparse
import heapq

BQT, BKT = 64, 128
WORKLOADS = {
    "1x65536": [65536], "4x16384": [16384] * 4, "8x8192": [8192] * 8, "16x4096": [4096] * 16,
    "32x2048": [2048] * 32, "64x1024": [1024] * 64, "256x256": [256] * 256,
}


def tiles_of(lens):
    out, qt0 = [], 0
    for d, n in enumerate(lens):
        out += [(d, n, k0, qt0) for k0 in range(0, n, BKT)]
        qt0 += -(-n // BQT)
    return out


def steps(n, k0):
    return -(-(n - k0) // BQT)


def order(tiles, heads, up):
    """BwdSchedule's list: (tile, head) longest first, or every document walking up."""
    if up:
        docs = {}
        for i, t in enumerate(tiles):
            docs.setdefault(t[0], []).append(i)
        o = [i for d in sorted(docs, key=lambda d: (-tiles[docs[d][0]][1], d)) for i in reversed(docs[d])]
    else:
        o = sorted(range(len(tiles)), key=lambda i: (-steps(tiles[i][1], tiles[i][2]), i))
    return [(t, h) for t in o for h in range(heads)]


def run(lens, heads, ctas, up, claim_at_start, T=1.0, L=1.0, r=0.2, E=0.5):
    """Makespan in units of T and the CTAs' busy fraction."""
    tiles = tiles_of(lens)
    q = [(0.0, c, 0.0) for c in range(ctas)]  # (claim time, CTA, when its claimed item may start)
    heapq.heapify(q)
    release, busy, end = {}, 0.0, 0.0
    for ti, h in order(tiles, heads, up):
        _, c, start = heapq.heappop(q)
        _, n_doc, k0, qt0 = tiles[ti]
        n = steps(n_doc, k0)
        walk = [k0 + BQT * s if up else k0 + BQT * (n - 1 - s) for s in range(n)]
        t, buf_free, last_admit = start, 0.0, 0.0
        def hand_off(t, q0):
            nonlocal buf_free, last_admit
            t = max(t, buf_free)
            key = (h, qt0 + q0 // BQT)
            admit = max(t, last_admit + r, release.get(key, 0.0))
            buf_free, last_admit, release[key] = admit + r, admit, admit + L
            return t
        for k in range(n):
            t += T
            busy += T
            if k:
                t = hand_off(t, walk[k - 1])
        t = hand_off(t, walk[-1]) + E
        end = max(end, t)
        heapq.heappush(q, (start if claim_at_start else max(start, t - 3 * T), c, t))
    return end, busy / (end * ctas)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", action="append", help="e.g. 16x4096 (default: 64x1024 16x4096 8x8192 1x65536)")
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--ctas", type=int, default=132)
    ap.add_argument("--L", type=float, default=1.0, help="semaphore release after admission, in steps")
    a = ap.parse_args()
    print("workload   walk  claim at start    claim late        (makespan in steps, CTAs busy)")
    for w in a.workload or ["64x1024", "16x4096", "8x8192", "1x65536"]:
        # (1x65536 runs as two launches of 8 heads: the dQ scratch budget's head chunks)
        heads = a.heads // 2 if w == "1x65536" else a.heads
        for up in (False, True):
            s = run(WORKLOADS[w], heads, a.ctas, up, True, L=a.L)
            l = run(WORKLOADS[w], heads, a.ctas, up, False, L=a.L)
            print(f"{w:<10} {'up' if up else 'down':<5} {s[0]:7.0f} ({s[1]:.2f})    {l[0]:7.0f} ({l[1]:.2f})")


if __name__ == "__main__":
    main()
