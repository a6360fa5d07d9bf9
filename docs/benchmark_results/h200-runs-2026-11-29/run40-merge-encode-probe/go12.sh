# install, GPU tests, ncu of the merge (HEAD vs tree), chained A/B (HEAD vs tree), encode probe
bash ab_step/install.sh
export PYTHONPATH=/tmp/site:/tmp/mlxcel-shim:$PWD:$PWD/tests:$PWD/benchmarks:$PWD/ab_step
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
MLXCEL_KERNELS=fused MLXCEL_POISON_OUTPUTS=nan timeout 220 python3 -m pytest -q tests/test_fused_kernels.py tests/test_cascade_planner.py -p no:cacheprovider --junitxml=$OUT/gpu_tests.xml 2>&1 | tail -4 | tee $OUT/tests.txt
timeout 100 ncu --clock-control none -k regex:mlxcel --metrics gpu__time_duration.sum --csv python3 ab_step/ncu_merge.py > $OUT/ncu.csv 2>$OUT/ncu.err
python3 - <<'PY'
import csv, os
rows = [r for r in csv.DictReader(l for l in open(os.environ["OUT"] + "/ncu.csv") if l.startswith('"')) if r["Metric Name"] == "gpu__time_duration.sum"]
for r in rows: print(r["ID"], r["Kernel Name"][14:50], r["Grid Size"], r["Metric Value"])
PY
MLXCEL_KERNELS=fused timeout 170 python3 ab_step/ab_merge2.py $OUT/ab.json 2>&1 | tail -12
MLXCEL_KERNELS=fused timeout 60 python3 ab_step/probe_encode.py $OUT/probe.json 2>&1 | tail -3
