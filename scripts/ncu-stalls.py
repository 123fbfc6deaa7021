#!/usr/bin/env python3
"""Summarise Nsight Compute's per-SASS-instruction counters of one kernel launch.

Input: the CSV of `ncu -i REPORT --page source --print-source sass --csv` (gzip or plain), as
`bench/ncu-kernels.sh` writes it. Prints

  1. the warp-stall samples of the whole launch by reason;
  2. the instructions grouped by how often they ran (a loop body is one group: e.g. the
     backward's interior step runs steps x consumer warps times), samples and top reasons each;
  3. with --loop N (an execution count from 2., or the largest group by default): that loop's
     instructions in address order, the ones over --min-share of the loop's samples, and
     with --cycles C (the loop iteration's clocks, e.g. elapsed SM cycles / iterations per warp)
     every figure also as clocks per iteration;
  4. with --phases ADDR:NAME,...: the loop's samples summed from each address on (the low hex
     digits of the address are enough: they are matched as a suffix);
  5. with --regions: the same sums, cut automatically at the loop's wgmma, wgmma-wait, barrier and
     fence instructions;
  6. with --smem: shared-memory wavefronts by opcode (wgmma operand reads included), for the
     launch and per loop iteration.

    python3 scripts/ncu-stalls.py out/attn_bwd_v4.sass.csv.gz
    python3 scripts/ncu-stalls.py out/attn_bwd_v4.sass.csv.gz --cycles 5600 \\
        --phases bd5b0:start,bdc80:S-wait,c0070:dV/dK,c1fa0:dQ-store

Samples are taken per warp at a fixed interval, so a loop instruction's share of the loop's
samples is its share of the warp's time in the loop; "selected" is the issuing itself, every
other reason a stall (ncu's Profiling Guide names them). Samples without a reason in the CSV
(e.g. a wgmma waiting for the tensor cores) are counted as "unlisted".
"""
import argparse
import collections
import csv
import gzip
import sys

SAMPLES = "Warp Stall Sampling (All Samples)"
EXECUTED = "Instructions Executed"
WAVEFRONTS = "L1 Wavefronts Shared"
# instructions that bound the automatic regions of --regions: products, their waits, barriers
LANDMARKS = ("QGMMA", "HGMMA", "WARPGROUP.DEPBAR", "BAR.SYNC", "SYNCS", "FENCE", "MEMBAR")


def load(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        rows = list(csv.reader(f))
    # the first line names the kernel; the header is the first line that has "Address"
    start = next(i for i, r in enumerate(rows) if r and r[0] == "Address")
    hdr, data = rows[start], [r for r in rows[start + 1:] if len(r) == len(rows[start])]
    if SAMPLES not in hdr or EXECUTED not in hdr:
        sys.exit(f"{path}: no '{SAMPLES}' / '{EXECUTED}' columns (ncu --set full with source counters?)")
    ix = {h: i for i, h in enumerate(hdr)}
    reasons = [h for h in hdr if h.startswith("stall_") and "Not Issued" not in h]

    def num(r, k):
        try:
            return float(r[ix[k]])
        except ValueError:
            return 0.0

    out = []
    for r in data:
        st = {k[6:]: num(r, k) for k in reasons}
        s = num(r, SAMPLES)
        st["unlisted"] = max(0.0, s - sum(st.values()))
        out.append({"addr": r[ix["Address"]], "sass": r[ix["Source"]].strip(), "n": num(r, EXECUTED),
                    "samples": s, "stalls": st,
                    "smem": num(r, WAVEFRONTS) if WAVEFRONTS in ix else 0.0})
    return out


def opcode(sass):
    """The opcode of a SASS line (its predicate, e.g. `@!P0`, skipped)."""
    words = sass.split()
    return words[1] if sass.startswith("@") and len(words) > 1 else words[0]


def top(stalls, k, scale):
    return " ".join(f"{n}:{v * scale:.0f}" for n, v in sorted(stalls.items(), key=lambda kv: -kv[1])[:k] if v > 0)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv")
    ap.add_argument("--loop", type=float, help="execution count of the loop to list (default: the group with most samples)")
    ap.add_argument("--cycles", type=float, help="clocks per loop iteration: print clocks instead of samples")
    ap.add_argument("--min-share", type=float, default=0.005, help="list loop instructions above this share (0.005)")
    ap.add_argument("--phases", help="ADDR:NAME,... (address suffixes in hex) to sum the loop by phase")
    ap.add_argument("--regions", action="store_true",
                    help="sum the loop between its wgmma, wgmma-wait, barrier and fence instructions")
    ap.add_argument("--smem", action="store_true",
                    help="shared-memory wavefronts by opcode: the launch's, and the loop's per iteration")
    a = ap.parse_args()
    ins = load(a.csv)
    total = sum(i["samples"] for i in ins)
    if total == 0:
        sys.exit("no warp-stall samples in the file")
    agg = collections.Counter()
    for i in ins:
        agg.update(i["stalls"])
    print(f"== whole launch: {total:.0f} samples")
    for n, v in agg.most_common():
        if v:
            print(f"  {n:18s} {100 * v / total:5.1f}%")
    groups = collections.defaultdict(list)
    for i in ins:
        if i["n"]:
            groups[float(f"{i['n']:.3g}")].append(i)
    print("== by execution count (a loop body is one group)")
    ranked = sorted(groups.items(), key=lambda kv: -sum(i["samples"] for i in kv[1]))
    for n, g in ranked[:10]:
        s = sum(i["samples"] for i in g)
        st = collections.Counter()
        for i in g:
            st.update(i["stalls"])
        print(f"  ran {n:10.3g}x  {len(g):5d} instructions  {100 * s / total:5.1f}% of samples  "
              + top(st, 4, 100 / s) + " (% of the group)")
    loop_n = a.loop if a.loop else ranked[0][0]
    loop = [i for i in ins if i["n"] and abs(i["n"] - loop_n) <= 0.01 * loop_n]
    ls = sum(i["samples"] for i in loop)
    if not loop or ls == 0:
        sys.exit(f"no instructions ran ~{loop_n:.3g} times")
    scale = (a.cycles / ls) if a.cycles else 1.0
    unit = "clocks/iter" if a.cycles else "samples"
    print(f"== loop: instructions that ran ~{loop_n:.3g} times ({len(loop)}), {unit} over {100 * a.min_share:.1f}%")
    for i in loop:
        if i["samples"] >= a.min_share * ls:
            print(f"  {i['addr'][-5:]} {i['samples'] * scale:8.0f}  {i['sass'][:60]:60s} {top(i['stalls'], 3, scale)}")
    if a.regions:
        print(f"== loop by region ({unit}; each region ends at the landmark instruction shown)")
        acc, last = 0.0, 0.0
        for k, i in enumerate(loop):
            acc += i["samples"]
            if opcode(i["sass"]).startswith(LANDMARKS) or k == len(loop) - 1:
                print(f"  {i['addr'][-5:]} {k:5d} {(acc - last) * scale:8.0f}  cum {acc * scale:8.0f}  {i['sass'][:56]}")
                last = acc
    if a.smem:
        launch = sum(i["smem"] for i in ins)
        if launch == 0:
            print(f"== no '{WAVEFRONTS}' counts in the file")
        else:
            by = collections.defaultdict(lambda: [0.0, 0.0])
            in_loop = {i["addr"] for i in loop}
            for i in ins:
                if i["smem"]:
                    key = ("loop" if i["addr"] in in_loop else "other", opcode(i["sass"]))
                    by[key][0] += i["smem"]
                    by[key][1] += i["n"]
            print(f"== shared-memory wavefronts: {launch:.3g} in the launch; loop ones per iteration and per execution")
            for (where, op), (w, n) in sorted(by.items(), key=lambda kv: -kv[1][0])[:16]:
                per_iter = f"{w / loop_n:8.1f}/iter" if where == "loop" else " " * 13
                print(f"  {where:5s} {op:36s} {100 * w / launch:5.1f}%  {per_iter}  {w / max(n, 1):5.2f}/exec")
    if a.phases:
        marks = []
        for m in a.phases.split(","):
            addr, name = m.split(":", 1)
            hit = next((k for k, i in enumerate(loop) if i["addr"].lower().endswith(addr.lower())), None)
            if hit is None:
                sys.exit(f"--phases: no loop instruction at an address ending in {addr}")
            marks.append((hit, name))
        marks.sort()
        print(f"== loop by phase ({unit})")
        for k, (start, name) in enumerate(marks):
            end = marks[k + 1][0] if k + 1 < len(marks) else len(loop)
            part = loop[start:end]
            st = collections.Counter()
            for i in part:
                st.update(i["stalls"])
            s = sum(i["samples"] for i in part)
            print(f"  {name:14s} {end - start:5d} instructions {s * scale:8.0f}  {top(st, 4, scale)}")


if __name__ == "__main__":
    main()
