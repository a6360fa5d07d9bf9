# Part 2 (same warm machine as part 1, whose e2e bench ran out of memory in mlx-lm's arm with MLX's graph byte
# bound lifted): the end-to-end bench with the byte bound at MLX's default.
export PYTHONPATH=/tmp/site:/tmp/mlxcel-shim:$PWD:$PWD/tests:$PWD/benchmarks PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 MLX_PTX_CACHE_DIR=/tmp/ptx MLX_MAX_MB_PER_BUFFER=1000
timeout 270 python3 benchmarks/gpu_e2e_bench.py --out /tmp/e2e2 > $OUT/e2e.log 2>&1; echo "e2e exit $? at $SECONDS s"
cp /tmp/e2e2/e2e_bench.json /tmp/e2e2/e2e_bench.md $OUT/ 2>/dev/null; grep "^| " $OUT/e2e_bench.md
