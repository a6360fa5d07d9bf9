# After one upload per step's small arrays: the interleaved trace probe (2 rounds, then a cProfile of whole-mode
# steps), the e2e bench with mlx-lm, the GPU tests of the engine and the fused kernels' cascade.
# Device call: carry .whl-b .whl-lm after a call that copied .whl-a into /tmp/w.
set -u
if ! PYTHONPATH=/tmp/site python3 -c "import mlx.core, mlx_lm" 2>/dev/null; then
  cp .whl-b/* /tmp/w/ && cat /tmp/w/part.* > /tmp/w/mlx_cuda_13-0.32.4-py3-none-manylinux_2_35_x86_64.whl && rm /tmp/w/part.*
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site /tmp/w/*.whl .whl-lm/*.whl || exit 1
fi
mkdir -p /tmp/mlxcel-shim/mlxcel && ln -sfn $PWD/engine /tmp/mlxcel-shim/mlxcel/engine && ln -sfn $PWD/kernels /tmp/mlxcel-shim/mlxcel/kernels
export PYTHONPATH=/tmp/site:/tmp/mlxcel-shim:$PWD:$PWD/tests:$PWD/benchmarks PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
export MLX_PTX_CACHE_DIR=/tmp/ptx
echo "installed at $SECONDS s"
timeout 200 python3 docs/benchmark_results/h200-runs-2026-12-01/run12-whole-layer/trace_probe.py 2 > $OUT/trace_probe.log 2>&1
echo "probe exit $? at $SECONDS s"; grep -E '^(whole|halves|flat|tokens)' $OUT/trace_probe.log
timeout 200 python3 benchmarks/gpu_e2e_bench.py --out /tmp/e2e > $OUT/e2e.log 2>&1; echo "e2e exit $? at $SECONDS s"
cp /tmp/e2e/e2e_bench.json /tmp/e2e/e2e_bench.md $OUT/ 2>/dev/null; grep "^| " $OUT/e2e_bench.md
MLXCEL_KERNELS=fused MLXCEL_POISON_OUTPUTS=nan timeout $((585 - SECONDS)) python3 -m pytest -q -p no:cacheprovider -rf \
  tests/test_engine.py tests/test_kernels.py > $OUT/tests.log 2>&1
echo "tests exit $? at $SECONDS s"; grep -E "^FAILED|^ERROR|passed|failed" $OUT/tests.log | tail -12
