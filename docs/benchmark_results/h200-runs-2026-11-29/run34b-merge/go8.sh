# install, GPU tests, ncu durations HEAD vs tree (cascade step + flat), source profile of level 0, merge A/B timing
bash ab_step/install.sh
export PYTHONPATH=/tmp/site:/tmp/mlxcel-shim:$PWD:$PWD/tests:$PWD/benchmarks:$PWD/ab_step
MLXCEL_KERNELS=fused MLXCEL_POISON_OUTPUTS=nan timeout 200 python3 -m pytest -q -x tests/test_fused_kernels.py tests/test_cascade_planner.py -p no:cacheprovider 2>&1 | tail -3 | tee $OUT/tests.txt
timeout 100 ncu --clock-control none -k regex:mlxcel --metrics gpu__time_duration.sum --csv python3 ab_step/ncu_merge.py > $OUT/ncu.csv 2>$OUT/ncu.err
python3 - <<'PY'
import csv, os
rows = [r for r in csv.DictReader(l for l in open(os.environ["OUT"] + "/ncu.csv") if l.startswith('"')) if r["Metric Name"] == "gpu__time_duration.sum"]
for r in rows: print(r["ID"], r["Kernel Name"][14:50], r["Grid Size"], r["Metric Value"])
PY
timeout 120 ncu --clock-control none -k regex:mlxcel_partial --launch-skip 3 --launch-count 1 --section SpeedOfLight --section WarpStateStats --section SourceCounters --section MemoryWorkloadAnalysis -o $OUT/level0 python3 ab_step/ncu_level0.py > $OUT/ncu_l0.log 2>&1; tail -1 $OUT/ncu_l0.log
ncu --import $OUT/level0.ncu-rep --page source --csv --print-source sass > $OUT/level0_sass.csv 2>&1; rm -f $OUT/level0.ncu-rep
timeout 200 python3 ab_step/ab_merge.py $OUT/ab_merge.json 2>&1 | tail -12
