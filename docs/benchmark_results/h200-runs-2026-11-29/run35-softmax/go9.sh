# install, GPU tests, ncu durations HEAD vs tree, A/B timing HEAD vs tree, then the full bench with breakdown
bash ab_step/install.sh
export PYTHONPATH=/tmp/site:/tmp/mlxcel-shim:$PWD:$PWD/tests:$PWD/benchmarks:$PWD/ab_step
MLXCEL_KERNELS=fused MLXCEL_POISON_OUTPUTS=nan timeout 200 python3 -m pytest -q -x tests/test_fused_kernels.py tests/test_cascade_planner.py -p no:cacheprovider 2>&1 | tail -3 | tee $OUT/tests.txt
timeout 100 ncu --clock-control none -k regex:mlxcel --metrics gpu__time_duration.sum --csv python3 ab_step/ncu_merge.py > $OUT/ncu.csv 2>$OUT/ncu.err
python3 - <<'PY'
import csv, os
rows = [r for r in csv.DictReader(l for l in open(os.environ["OUT"] + "/ncu.csv") if l.startswith('"')) if r["Metric Name"] == "gpu__time_duration.sum"]
for r in rows: print(r["ID"], r["Kernel Name"][14:50], r["Grid Size"], r["Metric Value"])
PY
timeout 200 python3 ab_step/ab_merge.py $OUT/ab.json 2>&1 | tail -10
MLXCEL_KERNELS=fused timeout 250 python3 benchmarks/gpu_attention_bench.py --out $OUT/bench --shared 2048,8192,32768 --batches 4,8,32,64 --reps 10 --copy-mib 256 --matmul-n 4096 --breakdown 2>&1 | tail -16
