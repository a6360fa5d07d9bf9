# The skinny matmul's looping launch (gate/up: 128 blocks of three column tiles, rings running on across
# tiles) against one tile a block: its GPU tests, the matmul bench at 32 rows, then probe.py (the engine's
# cascade step, A B B A in one process, with each kernel's spread over its calls).
# Device call: carry .whl-b .whl-lm after a call that copied .whl-a into /tmp/w.
set -u
if ! PYTHONPATH=/tmp/site python3 -c "import mlx.core, mlx_lm" 2>/dev/null; then
  cp .whl-b/* /tmp/w/ && cat /tmp/w/part.* > /tmp/w/mlx_cuda_13-0.32.4-py3-none-manylinux_2_35_x86_64.whl && rm /tmp/w/part.*
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site /tmp/w/*.whl .whl-lm/*.whl || exit 1
fi
mkdir -p /tmp/mlxcel-shim/mlxcel && ln -sfn $PWD/engine /tmp/mlxcel-shim/mlxcel/engine && ln -sfn $PWD/kernels /tmp/mlxcel-shim/mlxcel/kernels
export PYTHONPATH=/tmp/site:/tmp/mlxcel-shim:$PWD:$PWD/tests:$PWD/benchmarks PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
export MLX_PTX_CACHE_DIR=/tmp/ptx
D=docs/benchmark_results/h200-runs-2026-12-03/run46-loop
echo "installed at $SECONDS s"
timeout 150 python3 -m pytest -q -p no:cacheprovider -rf tests/test_cuda_matmul.py -k "not compiles" > $OUT/tests.log 2>&1
echo "tests exit $? at $SECONDS s"; grep -E "^FAILED|^ERROR|passed|failed|Error" $OUT/tests.log | tail -8
timeout 120 python3 benchmarks/gpu_matmul_bench.py --out /tmp/mm --rows 32 > $OUT/matmul.log 2>&1
echo "matmul exit $? at $SECONDS s"; cp /tmp/mm/* $OUT/ 2>/dev/null; grep "^| " $OUT/matmul.md
timeout $((560 - SECONDS)) python3 $D/probe.py /tmp/probe > $OUT/probe.log 2>&1
echo "probe exit $? at $SECONDS s"; cp /tmp/probe/* $OUT/ 2>/dev/null; cat $OUT/probe.md; tail -3 $OUT/probe.log | cut -c1-400
