"""Per workload: our training-call time (flamia bench attention JSON), the best BF16 baseline of
anchors.py from the same device call, and the ratio (baseline / ours: > 1 means we are faster).
Usage: python3 bench/compare.py OURS.json ANCHORS.json [OURS2.json]"""
import json, sys

ours = [json.load(open(p)) for p in [sys.argv[1]] + sys.argv[3:]]
anchors = json.load(open(sys.argv[2]))
base = {r["workload"]: r for r in anchors["rows"]}
print("anchors env:", json.dumps(anchors.get("env", {})))
for o in ours:
    print("ours: %s %s, SM clock before %s, after %s" % (o["device"], o["path"], o["sm_clock_before"], o["sm_clock_after"]))
print("\n%-14s | %12s %12s | %-22s %10s | %8s" % ("workload", "ours train", "ours (2nd)" if len(ours) > 1 else "", "best BF16 baseline", "ms", "ratio"))
for r in ours[0]["rows"]:
    w = r["workload"]; b = base.get(w, {})
    cands = [(k[:-3], b[k]) for k in ("fa2_varlen_ms", "cudnn_pad_ms", "flex_ms") if k in b]
    second = [x for x in ours[1]["rows"] if x["workload"] == w] if len(ours) > 1 else []
    t2 = "%12.3f" % second[0]["train_ms"] if second else " " * 12
    mine = min([r["train_ms"]] + [x["train_ms"] for x in second])
    if cands:
        name, ms = min(cands, key=lambda c: c[1])
        print("%-14s | %12.3f %s | %-22s %10.3f | %8.3f" % (w, r["train_ms"], t2, name, ms, ms / mine))
    else:
        print("%-14s | %12.3f %s | %-22s %10s | %8s" % (w, r["train_ms"], t2, "(no baseline)", "-", "-"))
print("\nratio = best BF16 baseline ms / our best training-call ms (same device call)")
