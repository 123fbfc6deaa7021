"""Joules per call of each phase of our training call, from a `flamia bench attention` run with
FLAMIA_BENCH_ENERGY=1 (its stderr lines "energy window: WORKLOAD | PHASE | unix ms T0 T1 | calls N |
MS ms a call | SM MHZ MHz after") and a power log sampled beside it by
  nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_event_reasons.active \
      --format=csv,noheader -lms 20 > smi.csv
(timestamps in UTC, as on the device machine). Per window: the mean power over the samples inside
it (the first SKIP_MS left out: the power reading lags the load), x ms per call = mJ per call.
Under the card's 700 W cap the clock falls until power x time fits, so a phase's joules per call,
not its time at full clock, is what a sustained run pays.
Usage: python3 bench/energy.py BENCH.log SMI.csv [SKIP_MS (default 300)]"""
import datetime
import re
import sys

WINDOW = re.compile(
    r"energy window: (\S+) \| ([^|]+?) \| unix ms ([\d.]+) ([\d.]+) \| calls (\d+) \| ([\d.]+) ms a call"
    r" \| SM (\d+) MHz after")


def read_windows(path):
    out = []
    for line in open(path, errors="replace"):
        m = WINDOW.search(line)
        if m:
            w, phase, t0, t1, calls, ms, mhz = m.groups()
            out.append((w, phase.strip(), float(t0), float(t1), int(calls), float(ms), int(mhz)))
    return out


def read_power(path):
    """(unix ms, watts, SM MHz) per sample; lines that are not samples (errors, headers) skipped."""
    out = []
    for line in open(path, errors="replace"):
        p = [x.strip() for x in line.split(",")]
        if len(p) < 4:
            continue
        try:
            t = datetime.datetime.strptime(p[0], "%Y/%m/%d %H:%M:%S.%f")
            t = t.replace(tzinfo=datetime.timezone.utc).timestamp() * 1e3
            watts = float(p[3].split()[0])
            mhz = float(p[1].split()[0])
        except ValueError:
            continue
        out.append((t, watts, mhz))
    return out


def main(argv):
    if len(argv) not in (2, 3):
        sys.exit(__doc__)
    windows, power = read_windows(argv[0]), read_power(argv[1])
    skip = float(argv[2]) if len(argv) == 3 else 300.0
    if not windows:
        sys.exit("%s: no 'energy window:' lines (run the bench with FLAMIA_BENCH_ENERGY=1)" % argv[0])
    if not power:
        sys.exit("%s: no power samples (nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,... "
                 "--format=csv,noheader)" % argv[1])
    print("| workload | phase | ms a call | W | mJ a call | SM MHz (probe after) | smi MHz | samples |")
    print("|---|---|---|---|---|---|---|---|")
    for w, phase, t0, t1, calls, ms, mhz in windows:
        inside = [(watts, m) for t, watts, m in power if t0 + skip <= t <= t1]
        if not inside:
            print("| %s | %s | %.4f | - | - | %d | - | 0 (window %.0f ms: shorter than the skip, or no samples) |"
                  % (w, phase, ms, mhz, t1 - t0))
            continue
        watts = sum(x for x, _ in inside) / len(inside)
        smi = sum(m for _, m in inside) / len(inside)
        print("| %s | %s | %.4f | %.0f | %.2f | %d | %.0f | %d |" % (w, phase, ms, watts, watts * ms, mhz, smi, len(inside)))


if __name__ == "__main__":
    main(sys.argv[1:])
