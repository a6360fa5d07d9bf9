# H200, part 8 (same warm machine as part 7): end to end on the Qwen3-8B-shaped model, 32 sessions behind a 32K
# shared prefix, bf16 vs int8 pages, cascade and flat (ABBA), with int8's stacked level on the warpgroup kernel.
set -u
export PYTHONPATH=/tmp/site:/tmp/mlxcel-shim:$PWD:$PWD/tests:$PWD/benchmarks PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
export MLX_PTX_CACHE_DIR=/tmp/ptx
timeout 570 python3 benchmarks/gpu_e2e_bench.py --out /tmp/e2e --shared 32768 --kv-dtypes bfloat16,int8 \
  --fit-private 16384 --skip-mlx-lm > $OUT/e2e.log 2>&1; echo "e2e exit $? at $SECONDS s"
cp /tmp/e2e/e2e_bench.json /tmp/e2e/e2e_bench.md $OUT/ 2>/dev/null; grep "^| " $OUT/e2e_bench.md; tail -4 $OUT/e2e.log
