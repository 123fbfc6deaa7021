"""The A/B table of a `bench/device_ab.sh` log: per workload and variant, one column of `flamia
bench attention` (default the backward ms) for every round, and the change of the variant's
median against base's median in percent (negative: faster), plus the test lines per variant.
Usage: python3 bench/ab_table.py DEVICE_AB_LOG [--col bwd|fwd|train|quant|dq]
The column order of a bench row: workload, docs | quant ms, GB/s, fwd, bwd, train | TFLOP/s x3 |
dO quant, dq, dkdv | MiB."""
import re
import statistics
import sys

COLS = {"quant": 2, "fwd": 4, "bwd": 5, "train": 6, "dq": 11}


def parse(lines):
    """({variant: {workload: [value per round]}}, [test lines])."""
    runs, tests, cur = {}, [], None
    for line in lines:
        m = re.match(r"=== (\S+) \((\d+)\)", line)
        if m:
            cur = m.group(1)
            runs.setdefault(cur, {})
            continue
        if line.startswith("=== gpu_attention on") or line.startswith("test result") or "panicked" in line:
            tests.append(line.rstrip())
            if line.startswith("==="):
                cur = None
            continue
        if cur is None:
            continue
        cells = line.replace("|", " ").split()
        if len(cells) >= 13 and re.match(r"^(\d+x\d+|\d+\+\d+x\d+|lognormal)$", cells[0]):
            runs[cur].setdefault(cells[0], []).append(cells)
    return runs, tests


def main():
    args = sys.argv[1:]
    col = "bwd"
    if "--col" in args:
        i = args.index("--col")
        col = args[i + 1] if i + 1 < len(args) else ""
        del args[i:i + 2]
    if len(args) != 1 or col not in COLS:
        sys.exit(__doc__ + "\n--col takes one of: " + ", ".join(COLS))
    runs, tests = parse(open(args[0]))
    if "base" not in runs:
        sys.exit(f"{args[0]}: no '=== base (N)' section: not a device_ab.sh log")
    for t in tests:
        print(t)
    k = COLS[col]
    variants = list(runs)
    print(f"\n{col} ms per round; change of the median against base")
    print("| workload | " + " | ".join(variants) + " |")
    print("|---|" + "---|" * len(variants))
    for w in runs["base"]:
        base = statistics.median(float(c[k]) for c in runs["base"][w])
        cells = []
        for v in variants:
            vals = [float(c[k]) for c in runs[v].get(w, [])]
            if not vals:
                cells.append("-")
                continue
            txt = " / ".join(f"{x:.3f}" for x in vals)
            if v != "base":
                txt += f" ({100 * (statistics.median(vals) / base - 1):+.1f}%)"
            cells.append(txt)
        print(f"| {w} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
