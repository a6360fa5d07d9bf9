# The skinny matmul against cuBLAS inside the engine, arms interleaved in one process (matmul_probe.py), after
# the GPU tests of the kernel and of the engine's cascade steps. Device call: carry .whl-b .whl-lm after a call
# that copied .whl-a into /tmp/w.
set -u
if ! PYTHONPATH=/tmp/site python3 -c "import mlx.core, mlx_lm" 2>/dev/null; then
  cp .whl-b/* /tmp/w/ && cat /tmp/w/part.* > /tmp/w/mlx_cuda_13-0.32.4-py3-none-manylinux_2_35_x86_64.whl && rm /tmp/w/part.*
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site /tmp/w/*.whl .whl-lm/*.whl || exit 1
fi
mkdir -p /tmp/mlxcel-shim/mlxcel && ln -sfn $PWD/engine /tmp/mlxcel-shim/mlxcel/engine && ln -sfn $PWD/kernels /tmp/mlxcel-shim/mlxcel/kernels
export PYTHONPATH=/tmp/site:/tmp/mlxcel-shim:$PWD:$PWD/tests:$PWD/benchmarks PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
export MLX_PTX_CACHE_DIR=/tmp/ptx
echo "installed at $SECONDS s"
MLXCEL_KERNELS=fused timeout 200 python3 -m pytest -q -p no:cacheprovider -rf tests/test_cuda_matmul.py \
  tests/test_engine.py -k "matmul or skinny or whole_layer or takes or kernel_compiles or products or launch_shape" \
  > $OUT/tests.log 2>&1
echo "tests exit $? at $SECONDS s"; grep -E "^FAILED|^ERROR|passed|failed|Error" $OUT/tests.log | tail -12
timeout $((580 - SECONDS)) python3 docs/benchmark_results/h200-runs-2026-12-01/run18-matmul-probe/matmul_probe.py 2 \
  > $OUT/matmul_probe.log 2>&1
echo "probe exit $? at $SECONDS s"; grep -vE "^\s*$" $OUT/matmul_probe.log | tail -20
