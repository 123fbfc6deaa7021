# session 14, last call: FLAMIA_FWD_OVERLAP (bitwise test, A/B, accuracy tests with it on)
C=.device-carry/bwd4; . bench/device-env.sh
echo "=== bitwise"; timeout 120 $C/gpu_attention --ignored --test-threads=1 forward_overlap 2>&1 | grep -E "test result|panicked|FAILED"
VARS="ov ov232" TESTS=0 REPS=2 OUT=$OUT/a WL="--workload 1x65536 --workload 16x4096 --workload 64x1024 --workload 256x256" timeout 150 bash bench/device_ab.sh > /dev/null 2>&1
for c in fwd train; do python3 bench/ab_table.py $OUT/a/device_ab.log --col $c; done
VARS="ov" TESTS=0 REPS=2 OUT=$OUT/b WL="--head-dim 64 --workload 1x65536 --workload 16x4096 --workload 256x256" timeout 60 bash bench/device_ab.sh > /dev/null 2>&1
for c in fwd train; do python3 bench/ab_table.py $OUT/b/device_ab.log --col $c; done
echo "=== accuracy with the overlap"; FLAMIA_FWD_OVERLAP=1 timeout 80 $C/gpu_attention --ignored --test-threads=1 long_documents mxfp8_causal head_dim_64_is_as_accurate 2>&1 | grep -E "test result|panicked|FAILED"
