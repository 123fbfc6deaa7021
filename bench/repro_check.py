#!/usr/bin/env python3
"""Summarises bench/repro_check.sh's runs bit for bit (stdlib only, runs on the device).

Usage: repro_check.py RUNS_DIR STEPS

RUNS_DIR holds one directory per run, named GROUP-N (`default-1`, `off-2`, ...) with the
trainer's metrics.jsonl (every step logged), its log GROUP-N.log, optional checksum traces
GROUP-N.trace (FLAMIA_TRACE_CHECKSUMS) and, where a final checkpoint was written,
checkpoints/step_<STEPS>/{model,optimizer}.safetensors. The run `resume` (STEPS/2, stop, --resume)
is compared with `default-1` (STEPS straight). Prints:

1. per group: runs, the mode each run's log reports, distinct bitwise loss trajectories (with the
   runs of each), the first step where any run leaves the first run's trajectory and the largest
   loss difference, whether the final model and optimizer files are byte-equal, and the median
   tokens/s over the steps after the first fifth (steps 11-50 of 50) of the runs made alone on
   the GPU (names in SOLO, space-separated, from the environment);
2. resume vs straight: losses bitwise, final files byte-equal;
3. per trace group: the first line where two traces differ and which tensors differ there, and
   over the steps before the loss splits, how many steps each parameter gradient differed in.
"""

import hashlib
import json
import os
import re
import statistics
import struct
import sys

root, steps = sys.argv[1], int(sys.argv[2])
solo = set(os.environ.get("SOLO", "").split())
from_step = steps // 5  # tokens/s: steps after the first fifth (11-50 of 50)


def metrics(run):
    p = os.path.join(root, run, "metrics.jsonl")
    if not os.path.isfile(p):
        return []
    return [json.loads(l) for l in open(p) if l.strip()]


def bits(x):
    return struct.pack("<d", x).hex()


def mode(run):
    """The deterministic mode line of the run's log (`auto: on`, `false: off`, ...)."""
    p = os.path.join(root, run + ".log")
    if not os.path.isfile(p):
        return "no log"
    m = re.search(r"run\.deterministic (\S+): (on|off)[^\n]*?(fill of uninitialised memory (on|off))?\n",
                  open(p, errors="replace").read())
    if not m:
        return "?"
    s = f"{m.group(1)}:{m.group(2)}"
    return s + (f" fill {m.group(4)}" if m.group(4) else "")


def digest(run, name):
    p = os.path.join(root, run, "checkpoints", f"step_{steps:08d}", name)
    if not os.path.isfile(p):
        return None
    h = hashlib.sha256()
    with open(p, "rb") as f:
        for b in iter(lambda: f.read(1 << 24), b""):
            h.update(b)
    return h.hexdigest()[:16]


def trajectories(runs):
    """{loss bit tuple: [runs]}, first split step and max |diff| against the first run."""
    trajs, first, maxdiff = {}, None, 0.0
    base = metrics(runs[0]) if runs else []
    for r in runs:
        m = metrics(r)
        trajs.setdefault(tuple(bits(x["loss"]) for x in m), []).append(r)
        for a, b in zip(base, m):
            if bits(a["loss"]) != bits(b["loss"]):
                first = a["step"] if first is None else min(first, a["step"])
                maxdiff = max(maxdiff, abs(a["loss"] - b["loss"]))
    return trajs, first, maxdiff


runs = sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d)) and re.fullmatch(r".+-\d+", d))
groups = {}
for r in runs:
    groups.setdefault(r.rsplit("-", 1)[0], []).append(r)

print(f"{'group':<14} {'runs':>4} {'mode (log)':<18} {'distinct':>8} {'first split':>11} "
      f"{'max |dloss|':>11} {'files equal':>11} {'tok/s (alone)':>14}  last loss / steps")
for g, members in groups.items():
    members.sort(key=lambda r: int(r.rsplit("-", 1)[1]))
    done = [r for r in members if len(metrics(r)) > 0]
    modes = sorted({mode(r) for r in members})
    if not done:
        print(f"{g:<14} {len(members):>4} {','.join(modes):<18} no run logged a step")
        continue
    trajs, first, maxdiff = trajectories(done)
    ds = {(digest(r, "model.safetensors"), digest(r, "optimizer.safetensors")) for r in done}
    files = "-" if ds == {(None, None)} else ("yes" if len(ds) == 1 and None not in next(iter(ds)) else "NO")
    tps = [statistics.median([x["tps"] for x in metrics(r) if x["step"] > from_step] or [float("nan")])
           for r in done if r in solo]
    tps_s = "/".join(f"{t:,.0f}" for t in tps) if tps else "-"
    lens = sorted({len(metrics(r)) for r in done})
    last = metrics(done[0])[-1]["loss"]
    print(f"{g:<14} {len(done):>4} {','.join(modes):<18} {len(trajs):>8} "
          f"{'-' if first is None else first:>11} {maxdiff:>11.3g} {files:>11} {tps_s:>14}  "
          f"{last:.6f} / {lens}")
    if len(trajs) > 1:
        print(f"{'':<14} trajectories: {' | '.join(' '.join(v) for v in trajs.values())}")

# Tokens/s of the solo runs, per group (the deterministic mode's cost).
med = {}
for g, members in groups.items():
    v = [statistics.median([x["tps"] for x in metrics(r) if x["step"] > from_step])
         for r in members if r in solo and len(metrics(r)) > from_step]
    if v:
        med[g] = statistics.median(v)
if "default" in med and "off" in med:
    print(f"tokens/s, median over steps {from_step + 1}-{steps} of the runs alone on the GPU, median of runs: "
          + ", ".join(f"{g} {v:,.0f}" for g, v in med.items())
          + f"; default/off = {med['default'] / med['off']:.3f}"
          + (f", fill/off = {med['fill'] / med['off']:.3f}" if "fill" in med else ""))

# Resume: STEPS/2 + --resume STEPS/2 against default-1 (STEPS straight).
if os.path.isdir(os.path.join(root, "resume")):
    a, b = metrics("default-1"), metrics("resume")
    same = len(a) == len(b) == steps and all(bits(x["loss"]) == bits(y["loss"]) for x, y in zip(a, b))
    first = next((x["step"] for x, y in zip(a, b) if bits(x["loss"]) != bits(y["loss"])), None)
    fa = (digest("default-1", "model.safetensors"), digest("default-1", "optimizer.safetensors"))
    fb = (digest("resume", "model.safetensors"), digest("resume", "optimizer.safetensors"))
    print(f"resume ({steps // 2} + --resume {steps // 2}) vs default-1 ({steps} straight): "
          f"{len(b)} vs {len(a)} steps logged, losses bitwise equal: {'yes' if same else 'NO'}"
          + ("" if first is None else f" (first difference at step {first})")
          + f"; model/optimizer files equal: {'yes' if fa == fb and None not in fa else 'NO'} "
          f"(sha256 {fa[0]}/{fa[1]} vs {fb[0]}/{fb[1]})")

# Checksum traces: which tensor differs first, and which parameter gradients differ at all.
traces = {}
for f in sorted(os.listdir(root)):
    if f.endswith(".trace"):
        traces.setdefault(f.rsplit("-", 1)[0], []).append(f)


def fields(line):
    return dict(x.split("=", 1) for x in line.split()[2:] if "=" in x)


for g, files in traces.items():
    lines = {f: open(os.path.join(root, f)).read().splitlines() for f in files}
    ref = files[0]
    print(f"trace {g}: {len(files)} runs, {len(lines[ref])} lines in {ref}")
    for f in files[1:]:
        a, b = lines[ref], lines[f]
        i = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
        if i is None:
            print(f"  {f} == {ref} over {min(len(a), len(b))} lines")
            continue
        step = sum(1 for l in a[:i] if l.startswith("step ")) + 1
        fa, fb = fields(a[i]), fields(b[i])
        diff = [k for k in fa if fa.get(k) != fb.get(k)]
        print(f"  {f} vs {ref}: first difference on line {i + 1} (step {step}): "
              f"{' '.join(a[i].split()[:2])} differing {diff}")
        # Per parameter: in how many step lines its gradient differs, before the loss differs.
        count, n = {}, 0
        for x, y in zip(a, b):
            if not x.startswith("step "):
                continue
            fx, fy = fields(x), fields(y)
            if fx.get("loss") != fy.get("loss"):
                break
            n += 1
            for k in fx:
                if fx[k] != fy.get(k):
                    count[k] = count.get(k, 0) + 1
        attn = sum(1 for x, y in zip(a, b) if x.startswith("attn ") and x != y)
        print(f"    over {n} steps with equal loss: gradients differing (steps): {count or 'none'}; "
              f"attention lines differing in the whole trace: {attn}")
