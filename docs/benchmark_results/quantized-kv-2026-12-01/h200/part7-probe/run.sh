# H200, part 7's probe: which scale path of the int8 warpgroup level is wrong (probe.py). Same install as run6.sh.
set -u
if ! PYTHONPATH=/tmp/site python3 -c "import mlx.core, mlx_lm" 2>/dev/null; then
  cp .whl-b/* /tmp/w/ && cat /tmp/w/part.* > /tmp/w/mlx_cuda_13-0.32.4-py3-none-manylinux_2_35_x86_64.whl && rm /tmp/w/part.*
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site /tmp/w/*.whl .whl-lm/*.whl || exit 1
fi
mkdir -p /tmp/mlxcel-shim/mlxcel && ln -sfn $PWD/engine /tmp/mlxcel-shim/mlxcel/engine && ln -sfn $PWD/kernels /tmp/mlxcel-shim/mlxcel/kernels
export PYTHONPATH=/tmp/site:/tmp/mlxcel-shim:$PWD:$PWD/tests:$PWD/benchmarks PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
export MLX_PTX_CACHE_DIR=/tmp/ptx
echo "installed at $SECONDS s"
MLXCEL_KERNELS=fused timeout 120 python3 docs/benchmark_results/quantized-kv-2026-12-01/h200/part7-probe/probe.py 2>&1 | tail -12
MLXCEL_KERNELS=fused MLXCEL_LEVEL0_KERNEL=mma timeout 60 python3 docs/benchmark_results/quantized-kv-2026-12-01/h200/part7-probe/probe.py 2>&1 | tail -6
