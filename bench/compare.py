"""Per workload: our training call and forward (flamia bench attention JSON, one or two runs of the
same device call) against the best BF16 baseline of anchors.py from that call, as a markdown table
(docs/perf.md's form), and against cuDNN FP8 (bench/cudnn_fp8.py's JSON) where given. "ours / best"
takes our slower run: < 1 means we are faster. Ends with a verdict line per comparison (training call,
forward, quantiser + forward): under the best BF16 on how many workloads, and which are not.
Usage: python3 bench/compare.py OURS.json ANCHORS.json [OURS2.json] [--fp8 CUDNN_FP8.json]"""
import json
import sys

args = sys.argv[1:]
fp8 = None
if "--fp8" in args:
    i = args.index("--fp8")
    if i + 1 >= len(args):
        sys.exit("--fp8 needs the cudnn_fp8.json path")
    fp8 = json.load(open(args[i + 1]))
    del args[i:i + 2]
if len(args) not in (2, 3):
    sys.exit(__doc__)
ours = [json.load(open(p)) for p in [args[0]] + args[2:]]
anchors = json.load(open(args[1]))
base = {r["workload"]: r for r in anchors["rows"]}
# cuDNN FP8 rows that ran (skipped / failed ones carry no times)
fp8_rows = {r["workload"]: r for r in (fp8 or {}).get("rows", []) if "fwdbwd_ms" in r}
NAMES = {"fa2_varlen": "FA2 varlen", "cudnn_pad": "cuDNN", "flex": "Flex"}
print("anchors env:", json.dumps(anchors.get("env", {})))
if anchors.get("env", {}).get("grads", "accumulate") != "none":
    print("WARNING: these anchors timed each BF16 training call adding its input gradients onto the last call's "
          "(anchors.py before session 41, or ANCHOR_GRADS=accumulate): ~0.6 ms of extra adds in every baseline's "
          "train ms at 65,536 tokens; re-run bench/anchors.py for a like-for-like standing")
if fp8 is not None:
    print("cuDNN FP8 env:", json.dumps(fp8.get("env", {})))
for o in ours:
    print("ours: %s %s, SM clock before %s, after %s" % (o["device"], o["path"], o["sm_clock_before"], o["sm_clock_after"]))
    # (a d = 64 or GQA run against d = 128 baselines would compare unlike shapes)
    # (anchors JSON before the head-dim knob ran at 128)
    mine, theirs = (o["rows"] or [{}])[0].get("head_dim"), anchors.get("env", {}).get("head_dim", 128)
    if mine is not None and theirs is not None and mine != theirs:
        sys.exit("our head_dim %s is not the anchors' %s (ANCHOR_HEAD_DIM)" % (mine, theirs))
    # the quantiser against the device copy of the same run (JSON of a bench before session 34 has none)
    if "copy_gbs_before" in o and o["rows"]:
        copy = max(o["copy_gbs_before"], o["copy_gbs_after"])
        q = [r["quant_gbs"] for r in o["rows"]]
        print("  quantiser %.0f-%.0f GB/s = %.1f-%.1f%% of the device copy (%.0f before, %.0f after the workloads)"
              % (min(q), max(q), 100 * min(q) / copy, 100 * max(q) / copy, o["copy_gbs_before"], o["copy_gbs_after"]))
    # the v4 backward's dQ conversion timed alone (dkdv_ms since session 50; 0 in older JSON)
    conv = [(r["workload"], r["dkdv_ms"], r["train_ms"]) for r in o["rows"] if r.get("bwd_v4") and r.get("dkdv_ms")]
    if conv:
        print("  dQ conversion alone: " + ", ".join("%s %.3f ms (%.1f%% of the call)" % (w, c, 100 * c / t)
                                                 for w, c, t in conv))


def best(b, keys):
    c = [(k, b[k]) for k in keys if k in b]
    return min(c, key=lambda kv: kv[1]) if c else None


def clocks(row):
    """The SM clocks after the forward's, the backward's and the training call's loops (MHz)."""
    # (JSON of a bench before session 33 has none)
    return ",".join("%.0f" % row[k] if k in row else "-" for k in ("fwd_mhz", "bwd_mhz", "train_mhz"))


def runs(w):
    return [r for o in ours for r in o["rows"] if r["workload"] == w]


head = ["workload", "ours train ms", "best BF16 train ms", "ours / best", "ours fwd ms", "best BF16 fwd ms",
        "ours / best", "ours quant+fwd ms", "ours / best", "bwd TFLOP/s", "SM MHz after fwd,bwd,train"]
if fp8 is not None:
    head += ["cuDNN FP8 fwd+bwd ms", "ours / FP8", "cuDNN FP8 fwd ms", "ours fwd / FP8"]
print()
print("| " + " | ".join(head) + " |")
print("|" + "---|" * len(head))
# per column, each workload's ratio (our slower run over the best baseline) for the verdict below
ratios = {"train_ms": [], "fwd_ms": [], "quant_fwd_ms": []}
for r in ours[0]["rows"]:
    w = r["workload"]
    rs, b = runs(w), base.get(w, {})
    cols = [w]
    worst = {}
    for x in rs:  # the forward from BF16 inputs: the Q/K/V quantiser, then the FP8 forward
        x["quant_fwd_ms"] = x["quant_ms"] + x["fwd_ms"]
    fwd_keys = ("fa2_varlen_fwd_ms", "cudnn_pad_fwd_ms", "flex_fwd_ms")
    for ms_key, keys in (("train_ms", ("fa2_varlen_ms", "cudnn_pad_ms", "flex_ms")), ("fwd_ms", fwd_keys),
                         ("quant_fwd_ms", fwd_keys)):
        mine = [x[ms_key] for x in rs]
        worst[ms_key] = max(mine)
        cols.append(" / ".join("%.3f" % m for m in mine))
        hit = best(b, keys)
        if hit:
            ratios[ms_key].append((w, max(mine) / hit[1]))
            name = NAMES[hit[0].replace("_fwd_ms", "").replace("_ms", "")]
            if ms_key == "quant_fwd_ms":  # (the baseline is the one in the fwd column)
                cols += ["%.2fx" % (max(mine) / hit[1])]
                continue
            # (the baseline's clock after its loop where anchors.py recorded it: bench/anchors.py)
            mhz = b.get(hit[0][:-len("_ms")] + "_mhz")
            at = " @%.0f" % mhz if mhz else ""
            cols += ["%.3f (%s%s)" % (hit[1], name, at), "%.2fx" % (max(mine) / hit[1])]
        else:
            cols += ["-"] if ms_key == "quant_fwd_ms" else ["-", "-"]
    cols.append(" / ".join("%.0f" % x["bwd_tflops"] for x in rs))
    # (JSON of a bench before session 33 has no clock)
    cols.append(" / ".join(clocks(x) for x in rs))
    if fp8 is not None:
        f = fp8_rows.get(w)
        if f:
            cols += ["%.3f" % f["fwdbwd_ms"], "%.2fx" % (worst["train_ms"] / f["fwdbwd_ms"]),
                     "%.3f" % f["fwd_ms"], "%.2fx" % (worst["fwd_ms"] / f["fwd_ms"])]
        else:
            cols += ["-", "-", "-", "-"]
    print("| " + " | ".join(cols) + " |")
for key, what in (("train_ms", "training call"), ("fwd_ms", "forward (FP8 inputs)"),
                  ("quant_fwd_ms", "quantiser + forward (BF16 inputs)")):
    got = ratios[key]
    over = ["%s %.2fx" % (w, x) for w, x in got if x >= 1.0]
    print("\nverdict: %s under the best BF16 on %d of %d workloads%s" % (
        what, len(got) - len(over), len(got), " (not: " + ", ".join(over) + ")" if over else ""), end="")
print()
print("\nours / best: our slower run's ms over the best BF16 baseline's ms of the same device call (< 1: faster)")
print("ours fwd ms: the FP8 forward on inputs already quantised (issue 12's forward TFLOP/s); ours quant+fwd ms: "
      "with the Q/K/V quantiser before it, the forward from BF16 inputs as the BF16 baselines' forward starts")
print("SM MHz after fwd,bwd,train: the clock measured on the GPU right after our forward's, backward's and training "
      "call's timing loops (a baseline's '@MHz': the same after its loop); under the card's power cap a sustained loop "
      "runs slower clocks, and the time rises as the clock falls")
if fp8 is not None:
    print("ours / FP8: our slower training call over cuDNN FP8's forward + backward (its inputs already FP8 with "
          "per-tensor scales: no quantiser in its time; padded batches; '-' where it skipped or failed)")
