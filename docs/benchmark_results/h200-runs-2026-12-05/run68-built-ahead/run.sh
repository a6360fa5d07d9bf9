# Run 68 (two calls): run 67 with the projection kernels built ahead (probe.py). Device call: carry
# .whl-b .whl-lm after a call that copied .whl-a into /tmp/w.
set -u
if ! PYTHONPATH=/tmp/site python3 -c "import mlx.core, mlx_lm" 2>/dev/null; then
  cp .whl-b/* /tmp/w/ && cat /tmp/w/part.* > /tmp/w/mlx_cuda_13-0.32.4-py3-none-manylinux_2_35_x86_64.whl && rm /tmp/w/part.*
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site /tmp/w/*.whl .whl-lm/*.whl || exit 1
fi
mkdir -p /tmp/mlxcel-shim/mlxcel && ln -sfn $PWD/engine /tmp/mlxcel-shim/mlxcel/engine && ln -sfn $PWD/kernels /tmp/mlxcel-shim/mlxcel/kernels
export PYTHONPATH=/tmp/site:/tmp/mlxcel-shim:$PWD:$PWD/tests:$PWD/benchmarks PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
export MLX_PTX_CACHE_DIR=/tmp/ptx
echo "installed at $SECONDS s"; nvidia-smi --query-gpu=name --format=csv,noheader
timeout 400 python3 docs/benchmark_results/h200-runs-2026-12-05/run68-built-ahead/probe.py $OUT > $OUT/probe.log 2>&1
echo "probe exit $? at $SECONDS s"; tail -4 $OUT/probe.log | cut -c1-1500
timeout 180 python3 -m pytest -q -p no:cacheprovider tests/test_cuda_matmul.py tests/test_engine.py \
  -k "instance_rows or host_bound or builds_each_row or skinny or trace" > $OUT/tests.log 2>&1
echo "tests exit $? at $SECONDS s"; tail -3 $OUT/tests.log | cut -c1-300
