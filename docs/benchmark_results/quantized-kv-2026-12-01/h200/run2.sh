# H200, part 2 (same warm machine): end to end on the Qwen3-8B-shaped model, 32 sessions behind a 32K shared
# prefix, bf16 vs int8 pages, cascade and flat (ABBA), and the sessions of 16K own tokens each format's pool holds.
set -u
export PYTHONPATH=/tmp/site:/tmp/mlxcel-shim:$PWD:$PWD/tests:$PWD/benchmarks PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
timeout 570 python3 benchmarks/gpu_e2e_bench.py --out /tmp/e2e --shared 32768 --kv-dtypes bfloat16,int8 \
  --fit-private 16384 --skip-mlx-lm > $OUT/e2e.log 2>&1; echo "e2e exit $? at $SECONDS s"
cp /tmp/e2e/e2e_bench.json /tmp/e2e/e2e_bench.md $OUT/ 2>/dev/null; grep "^| " $OUT/e2e_bench.md; tail -4 $OUT/e2e.log
