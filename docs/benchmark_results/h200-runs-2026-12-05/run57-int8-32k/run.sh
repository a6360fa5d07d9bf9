# Issue 26's end to end on main: the Qwen3-8B-shaped model, 32 sessions behind a 32K shared prefix, bf16 vs int8
# pages, cascade and flat (ABBA), and the sessions of 16K own tokens each format's pool holds. Same warm machine.
set -u
mkdir -p /tmp/mlxcel-shim/mlxcel && ln -sfn $PWD/engine /tmp/mlxcel-shim/mlxcel/engine && ln -sfn $PWD/kernels /tmp/mlxcel-shim/mlxcel/kernels
export PYTHONPATH=/tmp/site:/tmp/mlxcel-shim:$PWD:$PWD/tests:$PWD/benchmarks PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
export MLX_PTX_CACHE_DIR=/tmp/ptx
timeout 540 python3 benchmarks/gpu_e2e_bench.py --out /tmp/e2e32 --shared 32768 --kv-dtypes bfloat16,int8 \
  --fit-private 16384 --skip-mlx-lm > $OUT/e2e.log 2>&1; echo "e2e exit $? at $SECONDS s"
cp /tmp/e2e32/e2e_bench.json $OUT/; cp /tmp/e2e32/e2e_bench.md $OUT/; grep "^| " $OUT/e2e_bench.md; tail -4 $OUT/e2e.log | cut -c1-300
