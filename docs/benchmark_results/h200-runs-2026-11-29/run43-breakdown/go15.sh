# install; nsys timeline of chained cascade steps and SDPA calls; breakdown bench
bash ab_step/install.sh
export PYTHONPATH=/tmp/site:/tmp/mlxcel-shim:$PWD:$PWD/tests:$PWD/benchmarks:$PWD/ab_step
which nsys ncu
MLXCEL_KERNELS=fused timeout 200 nsys profile --trace=cuda --cuda-graph-trace=node -o $OUT/timeline python3 ab_step/timeline_step.py 2>&1 | tail -5
timeout 200 nsys stats --report cuda_gpu_trace --format csv --output $OUT/trace $OUT/timeline.nsys-rep > /dev/null 2>&1
ls -la $OUT
python3 - <<'PY'
import csv, os, glob
f = glob.glob(os.environ["OUT"] + "/trace*.csv")[0]
rows = list(csv.DictReader(open(f)))
print(len(rows), list(rows[0].keys()))
ks = [r for r in rows if r.get("Name")]
for r in ks[-60:]:
    print(r["Start (ns)"], r["Duration (ns)"], r["Name"][:60])
PY
gzip $OUT/trace*.csv; rm -f $OUT/timeline.sqlite
MLXCEL_KERNELS=fused timeout 150 python3 benchmarks/gpu_attention_bench.py --out $OUT/bench --shared 8192 --batches 32 --reps 15 --copy-mib 256 --matmul-n 4096 --breakdown 2>&1 | tail -5
