PHASE=q3 bash bench/device_s14.sh > $OUT/q3.log 2>&1
VARS="fov240 fov232" TEST_VARS="fov232" REPS=2 OUT=$OUT/a bash bench/device_ab.sh > /dev/null 2>&1
VARS="fov232" TEST_VARS="fov232" TEST_FILTER=head_dim_64 REPS=2 OUT=$OUT/b WL="--head-dim 64 --workload 1x65536 --workload 16x4096 --workload 64x1024 --workload 256x256" bash bench/device_ab.sh > /dev/null 2>&1
