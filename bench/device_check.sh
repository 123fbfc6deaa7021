#!/bin/bash
# One device call: GPU tests, PTX -> ptxas (registers, spills, C75xx infos) -> SASS (QGMMA census).
# Usage on the device, from the repo root, with the test executables carried under target/release/deps:
#   bash bench/device_check.sh            (logs and PTX under $OUT)
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
O=${OUT:-/tmp/flamia-out}; P=/tmp/flamia-ptx; mkdir -p "$O" "$P"; L=$O/check.log
D=target/release/deps
exe() { ls -t $D/$1-* 2>/dev/null | grep -v '\.d$' | head -1; }
{
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv
echo "=== NVRTC compile of every source (writes PTX)"
FLAMIA_PTX_DIR=$P $(exe flamia_kernels) gpu:: --include-ignored 2>&1 | tail -15
echo "=== ptxas / SASS"
for f in $P/*.ptx; do
  b=$(basename $f .ptx)
  ptxas -arch=sm_90a -v $f -o /tmp/$b.cubin > /tmp/$b.ptxas 2>&1; echo "ptxas $b rc=$?"
  grep -E "Compiling|Used|spill|C75|warn" /tmp/$b.ptxas
  cuobjdump --dump-sass /tmp/$b.cubin > /tmp/$b.sass
  awk '/Function :/{f=$3} /[QH]GMMA/{c[f]++} END{for(k in c) printf "  %-28s %d GMMA instructions\n", k, c[k]}' /tmp/$b.sass | sort
  grep -oE "[QH]GMMA\.[^ ]*|HMMA\.[^ ]*" /tmp/$b.sass | sort | uniq -c
done
grep -m2 QGMMA /tmp/attn_fwd.cu.sass; grep -m2 QGMMA /tmp/attn_bwd.cu.sass
echo "=== GPU tests"
$(exe gpu_quant) --ignored --test-threads=1 2>&1
$(exe gpu_attention) --ignored --test-threads=1 --nocapture 2>&1 | grep -v "^$" | tee /tmp/attn_tests.log
nvidia-smi --query-gpu=clocks.sm,power.draw,temperature.gpu --format=csv
} 2>&1 | tee "$L"
