bash ab_step/install.sh
export PYTHONPATH=/tmp/site:/tmp/mlxcel-shim:$PWD:$PWD/tests:$PWD/benchmarks:$PWD/ab_step
MLXCEL_KERNELS=fused timeout 150 ncu --clock-control none --metrics gpu__time_duration.sum --csv python3 ab_step/ncu_sdpa.py > $OUT/ncu_sdpa.csv 2>$OUT/ncu_sdpa.err
python3 - <<'PY'
import csv, os
rows = [r for r in csv.DictReader(l for l in open(os.environ["OUT"] + "/ncu_sdpa.csv") if l.startswith('"')) if r["Metric Name"] == "gpu__time_duration.sum"]
print(len(rows))
for r in rows: print(r["ID"], r["Kernel Name"][:60], r["Grid Size"], r["Metric Value"])
PY
MLXCEL_KERNELS=fused timeout 300 python3 benchmarks/gpu_attention_bench.py --out $OUT/sweep --shared 8192 --batches 32 --reps 10 --copy-mib 256 --matmul-n 4096 --sweep --sweep-cells 8192x32,32768x32,8192x64,2048x64 2>&1 | tail -60 | grep -v '^{'
