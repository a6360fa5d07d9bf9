# After the op cuts (no transposes, no reshapes around the layer-op kernels): the probe, then the GPU tests
# of the layer ops and the engine. Device call: carry .whl-b .whl-lm after .whl-a.
set -u
cp .whl-b/* /tmp/w/ && cat /tmp/w/part.* > /tmp/w/mlx_cuda_13-0.32.4-py3-none-manylinux_2_35_x86_64.whl && rm /tmp/w/part.*
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site /tmp/w/*.whl .whl-lm/*.whl || exit 1
mkdir -p /tmp/mlxcel-shim/mlxcel && ln -sfn $PWD/engine /tmp/mlxcel-shim/mlxcel/engine && ln -sfn $PWD/kernels /tmp/mlxcel-shim/mlxcel/kernels
here=docs/benchmark_results/h200-runs-2026-12-01/run09-host-probe
export PYTHONPATH=/tmp/site:/tmp/mlxcel-shim:$PWD:$PWD/tests:$PWD/benchmarks:$here PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
export MLX_PTX_CACHE_DIR=/tmp/ptx
echo "installed at $SECONDS s"
timeout 120 python3 $here/host_probe.py cut > $OUT/probe-cut.log 2>&1; echo "cut exit $? at $SECONDS s"
grep "^cut" $OUT/probe-cut.log
MLXCEL_KERNELS=fused MLXCEL_POISON_OUTPUTS=nan timeout $((560 - SECONDS)) python3 -m pytest -q -p no:cacheprovider -rf \
  tests/test_layer_ops.py tests/test_engine.py > $OUT/tests.log 2>&1
echo "tests exit $? at $SECONDS s"; grep -E "^FAILED|^ERROR|passed|failed" $OUT/tests.log | tail -12
