# call 2: install, GPU tests, epilogue A/B (timing), ncu kernel durations old vs new
bash ab_step/install.sh
export PYTHONPATH=/tmp/site:/tmp/mlxcel-shim:$PWD:$PWD/tests:$PWD/benchmarks
MLXCEL_KERNELS=fused MLXCEL_POISON_OUTPUTS=nan timeout 200 python3 -m pytest -q -x tests/test_fused_kernels.py tests/test_cascade_planner.py -p no:cacheprovider 2>&1 | tail -4 | tee $OUT/tests.txt
timeout 120 ncu --clock-control none -k regex:mlxcel --metrics gpu__time_duration.sum --csv python3 ab_step/ncu_epilogue.py > $OUT/ncu.csv 2>$OUT/ncu.err
python3 - <<'PY'
import csv, os
rows = [r for r in csv.DictReader(l for l in open(os.environ["OUT"] + "/ncu.csv") if l.startswith('"')) if r["Metric Name"] == "gpu__time_duration.sum"]
for r in rows: print(r["ID"], r["Kernel Name"][14:60], r["Grid Size"], r["Metric Value"])
PY
timeout 300 python3 ab_step/ab_epilogue.py $OUT/ab_epilogue.json 2>&1 | tail -16
