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
three steps before the current one ends (BWD_LATE_CLAIM). No per-step variation, and the steps'
time does not depend on memory: what it shows is the schedule's own cost. Beside it, `--l2 MB`
replays the run's accesses in time order through an LRU cache of that size (d = 128: per step the
Q and dO tiles in both layouts, 32 KB, and the 32 KB FP32 dQ rows read and written back when
evicted; per item K, V and dim-major K, 48 KB) and prints the DRAM bytes and the time they take at
`--bw` TB/s against the steps' time at `--step-us`: where the DRAM time is the larger, the
kernel is memory-bound in that order.

    python3 bench/sched_model.py                      # the table of session 11 (docs/perf.md)
    python3 bench/sched_model.py --workload 16x4096 --L 3
    python3 bench/sched_model.py --fwd --workload 4x16384      # the forward's head groups (session 28)
    python3 bench/sched_model.py --fwd --hd 64 --workload lognormal   # (session 29: level, 0.14 GB)
    python3 bench/sched_model.py --l2 50 --heads 8 --group 2    # the backward's, per 8-head chunk
"""
import argparse
import heapq

BQT, BKT = 64, 128
WORKLOADS = {
    "1x65536": [65536], "4x16384": [16384] * 4, "8x8192": [8192] * 8, "16x4096": [4096] * 16,
    "32x2048": [2048] * 32, "64x1024": [1024] * 64, "256x256": [256] * 256,
    "8192+224x256": [8192] + [256] * 224,
    # flamia-kernels/src/gpu/bench.rs LOGNORMAL (anchors.py's, torch seed 1234)
    "lognormal": [1159, 1777, 325, 1422, 525, 2006, 1446, 2519, 796, 14975, 1239, 803, 910, 211, 936,
                  3171, 801, 2281, 1083, 193, 858, 3129, 483, 2346, 1381, 1224, 389, 1328, 2928, 437,
                  2878, 928, 1609, 322, 226, 6492],
}


def tiles_of(lens):
    out, qt0 = [], 0
    for d, n in enumerate(lens):
        out += [(d, n, k0, qt0) for k0 in range(0, n, BKT)]
        qt0 += -(-n // BQT)
    return out


def steps(n, k0):
    return -(-(n - k0) // BQT)


GROUP = None  # --group: query heads per group of the downward list (sched.rs HEAD_GROUP)


def order(tiles, heads, up):
    """BwdSchedule's list: (tile, head) longest first, the heads of a tile adjacent (in groups of
    GROUP heads, each group longest first, when set); or every document walking up: documents
    longest first, each head's key tiles highest first."""
    if up:
        docs = {}
        for i, t in enumerate(tiles):
            docs.setdefault(t[0], []).append(i)
        return [(i, h) for d in sorted(docs, key=lambda d: (-tiles[docs[d][0]][1], d))
                for h in range(heads) for i in reversed(docs[d])]
    o = sorted(range(len(tiles)), key=lambda i: (-steps(tiles[i][1], tiles[i][2]), i))
    g = GROUP or heads
    return [(t, h) for g0 in range(0, heads, g) for t in o for h in range(g0, min(heads, g0 + g))]


def fwd_dram(lens, heads, ctas, group, l2_mb, d=128):
    """The forward's list (FwdSchedule, longest first, in groups of `group` heads) on `ctas`
    persistent CTAs, one time unit per key tile: (makespan, GB of K and dim-major V read from
    DRAM through an LRU cache of `l2_mb` MB, 2 x 128 x d bytes per key tile)."""
    tiles = [(doc, n, q0) for doc, n in enumerate(lens) for q0 in range(0, n, 128)]
    cost = [-(-min(n, q0 + 128) // 128) for _, n, q0 in tiles]
    o = sorted(range(len(tiles)), key=lambda t: (-cost[t], t))
    items = [(t, h) for g0 in range(0, heads, group) for t in o for h in range(g0, min(heads, g0 + group))]
    q = [(0.0, c) for c in range(ctas)]
    heapq.heapify(q)
    trace, end = [], 0.0
    for t, h in items:
        s, c = heapq.heappop(q)
        doc = tiles[t][0]
        trace += [(s + k, ("kv", h, doc, k), 2 * 128 * d, False) for k in range(cost[t])]
        end = max(end, s + cost[t])
        heapq.heappush(q, (s + cost[t], c))
    rd, _ = dram_bytes(trace, l2_mb * 2**20)
    return end, rd / 1e9


def run(lens, heads, ctas, up, claim_at_start, T=1.0, L=1.0, r=0.2, E=0.5, trace=None):
    """Makespan in units of T and the CTAs' busy fraction; `trace` (a list) collects the accesses
    (time, key, bytes, written)."""
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
            if trace is not None:
                trace.append((admit, ("dq",) + key, 32 << 10, True))
            return t
        if trace is not None:
            trace.append((start, ("kv", h, ti), 48 << 10, False))
        for k in range(n):
            if trace is not None:
                trace.append((t, ("qdo", h, qt0 + walk[k] // BQT), 32 << 10, False))
            t += T
            busy += T
            if k:
                t = hand_off(t, walk[k - 1])
        t = hand_off(t, walk[-1]) + E
        end = max(end, t)
        heapq.heappush(q, (start if claim_at_start else max(start, t - 3 * T), c, t))
    return end, busy / (end * ctas)


def dram_bytes(trace, capacity):
    """Bytes read from and written back to DRAM by the accesses of `trace` through an LRU cache
    of `capacity` bytes (write-back: a dirty entry costs its bytes again when evicted or at the
    end)."""
    from collections import OrderedDict
    lru, used, rd, wr = OrderedDict(), 0, 0, 0
    for _, key, size, written in sorted(trace, key=lambda e: e[0]):
        if key in lru:
            lru.move_to_end(key)
            lru[key] = (size, lru[key][1] or written)
            continue
        rd += size
        lru[key] = (size, written)
        used += size
        while used > capacity:
            _, (sz, dirty) = lru.popitem(last=False)
            used -= sz
            wr += sz if dirty else 0
    wr += sum(sz for sz, dirty in lru.values() if dirty)
    return rd, wr


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", action="append", help="e.g. 16x4096 (default: 64x1024 16x4096 8x8192 1x65536)")
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--ctas", type=int, default=132)
    ap.add_argument("--L", type=float, default=1.0, help="semaphore release after admission, in steps")
    ap.add_argument("--l2", type=float, help="replay the accesses through an LRU cache of this many MB")
    ap.add_argument("--bw", type=float, default=3.5, help="DRAM TB/s for --l2 (H200 copy: about 4.2)")
    ap.add_argument("--step-us", type=float, default=2.92,
                    help="one step per SM, us (session 11: 93.1 ms / 31,837 steps per SM at 1x65536)")
    ap.add_argument("--group", type=int, help="query heads per group of the downward list (default: all)")
    ap.add_argument("--hd", type=int, default=128, help="head dim for --fwd's K/V bytes (128 or 64)")
    ap.add_argument("--fwd", action="store_true",
                    help="the forward's list per head group (16, 8, 4, 2, 1): makespan and K/V GB from DRAM through --l2 MB (default 50)")
    a = ap.parse_args()
    global GROUP
    GROUP = a.group
    if a.fwd:
        print("workload   group  makespan  K/V from DRAM GB")
        for w in a.workload or ["1x65536", "4x16384", "8x8192", "16x4096"]:
            for g in (16, 8, 4, 2, 1):
                end, gb = fwd_dram(WORKLOADS[w], a.heads, a.ctas, g, a.l2 or 50, a.hd)
                print(f"{w:<10} {g:5d} {end:9.0f} {gb:16.2f}")
        return
    if a.l2:
        print("workload   walk  claim   DRAM read GB  written GB   DRAM ms   steps ms")
        for w in a.workload or ["64x1024", "16x4096", "8x8192", "1x65536"]:
            heads = a.heads // 2 if w == "1x65536" else a.heads
            for up, early in ((False, True), (False, False), (True, False)):
                tr = []
                end, _ = run(WORKLOADS[w], heads, a.ctas, up, early, L=a.L, trace=tr)
                rd, wr = dram_bytes(tr, a.l2 * 2**20)
                launches = 2 if w == "1x65536" else 1
                print(f"{w:<10} {'up' if up else 'down':<5} {'start' if early else 'late':<6} "
                      f"{launches * rd / 1e9:12.2f} {launches * wr / 1e9:11.2f} "
                      f"{launches * (rd + wr) / (a.bw * 1e12) * 1e3:9.2f} {launches * end * a.step_us / 1e3:10.2f}")
        return
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
