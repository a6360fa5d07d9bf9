# call 2: install, GPU tests, lookup A/B, ncu of level 0 (source counters)
bash ab_step/install.sh
export PYTHONPATH=/tmp/site:/tmp/mlxcel-shim:$PWD:$PWD/tests:$PWD/benchmarks
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
MLXCEL_KERNELS=fused MLXCEL_POISON_OUTPUTS=nan timeout 200 python3 -m pytest -q tests/test_fused_kernels.py tests/test_cascade_planner.py -p no:cacheprovider 2>&1 | tail -4 | tee $OUT/tests.txt
timeout 200 python3 ab_step/ab_lookup.py $OUT/ab_lookup.json 2>&1 | tail -15
timeout 120 ncu --clock-control none -k regex:mlxcel_partial --launch-skip 3 --launch-count 1 --section SpeedOfLight --section WarpStateStats --section SourceCounters --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats -o $OUT/level0 python3 ab_step/ncu_level0.py > $OUT/ncu.log 2>&1; tail -2 $OUT/ncu.log
ncu --import $OUT/level0.ncu-rep --page details --csv > $OUT/level0_details.csv 2>&1
ncu --import $OUT/level0.ncu-rep --page source --csv --print-source sass > $OUT/level0_sass.csv 2>&1 || ncu --import $OUT/level0.ncu-rep --page source --csv > $OUT/level0_sass.csv 2>&1
wc -l $OUT/*.csv
