# Part 3 (same warm machine): a second read of the engine arms (mlx-lm skipped: its figure does not move).
export PYTHONPATH=/tmp/site:/tmp/mlxcel-shim:$PWD:$PWD/tests:$PWD/benchmarks PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 MLX_PTX_CACHE_DIR=/tmp/ptx MLX_MAX_MB_PER_BUFFER=1000
timeout 150 python3 benchmarks/gpu_e2e_bench.py --out /tmp/e2e3 --skip-mlx-lm > $OUT/e2e.log 2>&1; echo "e2e exit $? at $SECONDS s"
cp /tmp/e2e3/e2e_bench.json /tmp/e2e3/e2e_bench.md $OUT/ 2>/dev/null; grep "^| " $OUT/e2e_bench.md
