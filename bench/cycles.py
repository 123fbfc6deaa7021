"""Clock-normalised A/B of a session script's `bench_mhz` rounds (bench/device-bench.sh): for each
variant label and workload, every round's ms, the SM clock measured on the GPU right after that
loop, and their product in M cycles, then each variant's change against the first variant in
both (negative: faster). Under the 700 W cap a build that waits more draws less power, runs a
higher clock and can look level in ms while it takes more cycles (session 47: the long documents'
backward 1-4% slower in ms, 2-6% in cycles, against session 43's binary).
Usage: python3 bench/cycles.py LOG [--phase fwd|bwd|train]
It reads the blocks `=== LABEL round N` and their `  mhz WORKLOAD fwd MS @ MHZ bwd MS @ MHZ
train MS @ MHZ` lines (bench_mhz's output)."""
import re
import statistics
import sys

PHASES = ("fwd", "bwd", "train")


def parse(lines, phase):
    """{label: {workload: [(ms, mhz) per round]}} in the order the labels first appear."""
    runs, cur = {}, None
    for line in lines:
        m = re.match(r"=== (.*?) round (\d+)\s*$", line)
        if m:
            cur = m.group(1)
            runs.setdefault(cur, {})
            continue
        m = re.match(r"\s+mhz (\S+) (.*)$", line)
        if m and cur is not None:
            vals = {k: (float(a), float(b)) for k, a, b in re.findall(r"(fwd|bwd|train) ([\d.]+) @ ([\d.]+)", m.group(2))}
            if phase in vals:
                runs[cur].setdefault(m.group(1), []).append(vals[phase])
    return runs


def table(runs):
    """Markdown rows: label, workload, ms per round, MHz per round, M cycles per round, and the
    change of the median ms and median cycles against the first label's."""
    out = ["| variant | workload | ms | MHz | M cycles | ms vs first | cycles vs first |", "|---|---|---|---|---|---|---|"]
    base = next(iter(runs.values()), {})
    for label, per in runs.items():
        for w, rounds in per.items():
            ms = [r[0] for r in rounds]
            mhz = [r[1] for r in rounds]
            cyc = [a * b / 1e3 for a, b in rounds]
            dms = dcyc = ""
            if label != next(iter(runs)) and w in base:
                b_ms = statistics.median(r[0] for r in base[w])
                b_cyc = statistics.median(a * b / 1e3 for a, b in base[w])
                dms = f"{100 * (statistics.median(ms) / b_ms - 1):+.1f}%"
                dcyc = f"{100 * (statistics.median(cyc) / b_cyc - 1):+.1f}%"
            fmt = lambda xs, f: " / ".join(f.format(x) for x in xs)
            out.append(f"| {label} | {w} | {fmt(ms, '{:.2f}')} | {fmt(mhz, '{:,.0f}')} | {fmt(cyc, '{:.1f}')} | {dms} | {dcyc} |")
    return out


def main():
    args = sys.argv[1:]
    phase = "bwd"
    if "--phase" in args:
        i = args.index("--phase")
        phase = args[i + 1]
        del args[i : i + 2]
    if len(args) != 1 or phase not in PHASES:
        sys.exit(__doc__)
    runs = parse(open(args[0], encoding="utf-8", errors="replace"), phase)
    if not any(runs.values()):
        sys.exit(f"{args[0]}: no `=== LABEL round N` blocks with `mhz` lines")
    print("\n".join(table(runs)))


if __name__ == "__main__":
    main()
