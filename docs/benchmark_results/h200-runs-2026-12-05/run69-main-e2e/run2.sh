# Run 69, second call on the same warm H100: the cell without mlx-lm's arm (which ran out of the H100's 80 GB).
export PYTHONPATH=/tmp/site:/tmp/mlxcel-shim:$PWD:$PWD/tests:$PWD/benchmarks PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 MLX_PTX_CACHE_DIR=/tmp/ptx
timeout 330 python3 benchmarks/gpu_e2e_bench.py --out /tmp/e2e2 --skip-mlx-lm > $OUT/e2e2.log 2>&1; echo "exit $? at $SECONDS s"
cp /tmp/e2e2/e2e_bench.json $OUT/e2e2_bench.json; cp /tmp/e2e2/e2e_bench.md $OUT/e2e2_bench.md; grep "^| " $OUT/e2e2_bench.md
