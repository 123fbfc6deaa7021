"""Per workload: our training call and forward (flamia bench attention JSON, one or two runs of the
same device call) against the best BF16 baseline of anchors.py from that call, as a markdown table
(docs/perf.md's form). "ours / best" takes our slower run: < 1 means we are faster.
Usage: python3 bench/compare.py OURS.json ANCHORS.json [OURS2.json]"""
import json
import sys

ours = [json.load(open(p)) for p in [sys.argv[1]] + sys.argv[3:]]
anchors = json.load(open(sys.argv[2]))
base = {r["workload"]: r for r in anchors["rows"]}
NAMES = {"fa2_varlen": "FA2 varlen", "cudnn_pad": "cuDNN", "flex": "Flex"}
print("anchors env:", json.dumps(anchors.get("env", {})))
for o in ours:
    print("ours: %s %s, SM clock before %s, after %s" % (o["device"], o["path"], o["sm_clock_before"], o["sm_clock_after"]))


def best(b, keys):
    c = [(k, b[k]) for k in keys if k in b]
    return min(c, key=lambda kv: kv[1]) if c else None


def runs(w):
    return [r for o in ours for r in o["rows"] if r["workload"] == w]


print()
print("| workload | ours train ms | best BF16 train ms | ours / best | ours fwd ms | best BF16 fwd ms | ours / best | bwd TFLOP/s |")
print("|---|---|---|---|---|---|---|---|")
for r in ours[0]["rows"]:
    w = r["workload"]
    rs, b = runs(w), base.get(w, {})
    cols = [w]
    for ms_key, keys in (("train_ms", ("fa2_varlen_ms", "cudnn_pad_ms", "flex_ms")), ("fwd_ms", ("cudnn_pad_fwd_ms", "flex_fwd_ms"))):
        mine = [x[ms_key] for x in rs]
        cols.append(" / ".join("%.3f" % m for m in mine))
        hit = best(b, keys)
        if hit:
            name = NAMES[hit[0].replace("_fwd_ms", "").replace("_ms", "")]
            cols += ["%.3f (%s)" % (hit[1], name), "%.2fx" % (max(mine) / hit[1])]
        else:
            cols += ["-", "-"]
    cols.append(" / ".join("%.0f" % x["bwd_tflops"] for x in rs))
    print("| " + " | ".join(cols) + " |")
print("\nours / best: our slower run's ms over the best BF16 baseline's ms of the same device call (< 1: faster)")
