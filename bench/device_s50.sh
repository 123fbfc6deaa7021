#!/bin/bash
# Session 50's prepared call for the next session. Carry .device-carry/s49, .device-carry/s50,
# .device-carry/kc and .whl (47 MB): s49.txz holds session 43's binary (old/flamia) and older
# binaries, s50 the final tree's flamia (flamia.xz) and test binaries (tests.txz), which
# device_s49.sh puts over s49's.
#   n: the standing on the final tree (device_s49.sh a: ours, the BF16 anchors, cuDNN FP8, ours
#      again; ~5 minutes; the table's dkdv column is the v4 backward's dQ conversion alone,
#      which bench/compare.py turns into its share of the call), then on an H200 only the Q/K/V
#      quantiser's knock-outs (device_s48.sh q on s50's binary, ~3-4 minutes: is the H200's
#      quantiser, 78.5-80.7% of the copy in session 45, bound by its own per-SM rate? perf.md
#      Next 5). On an H100 the knock-outs ran in session 48 and are skipped.
set -u
mode=${1:?usage: device_s50.sh n}
case $mode in
n) bash "$(dirname "$0")/device_s49.sh" a
   if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
     xz -dc .device-carry/s50/flamia.xz > .device-carry/s50/flamia && chmod +x .device-carry/s50/flamia \
       && C=.device-carry/s50 bash "$(dirname "$0")/device_s48.sh" q
   else
     echo "(not an H200: the quantiser's knock-outs ran on an H100 in session 48; skipped)"
   fi ;;
*) echo "device_s50.sh: unknown mode '$mode' (n)"; exit 2 ;;
esac
