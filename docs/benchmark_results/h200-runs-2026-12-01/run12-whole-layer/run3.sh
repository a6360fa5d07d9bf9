# Whole-layer traces against traced halves, interleaved in one process (trace_probe.py), then the GPU tests of the
# engine. Device call: carry .whl-b .whl-lm after a call that copied .whl-a into /tmp/w.
set -u
cp .whl-b/* /tmp/w/ && cat /tmp/w/part.* > /tmp/w/mlx_cuda_13-0.32.4-py3-none-manylinux_2_35_x86_64.whl && rm /tmp/w/part.*
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site /tmp/w/*.whl .whl-lm/*.whl || exit 1
mkdir -p /tmp/mlxcel-shim/mlxcel && ln -sfn $PWD/engine /tmp/mlxcel-shim/mlxcel/engine && ln -sfn $PWD/kernels /tmp/mlxcel-shim/mlxcel/kernels
here=docs/benchmark_results/h200-runs-2026-12-01/run12-whole-layer
export PYTHONPATH=/tmp/site:/tmp/mlxcel-shim:$PWD:$PWD/tests:$PWD/benchmarks PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
export MLX_PTX_CACHE_DIR=/tmp/ptx
echo "installed at $SECONDS s"
timeout 330 python3 $here/trace_probe.py 3 > $OUT/trace_probe.log 2>&1; echo "probe exit $? at $SECONDS s"
grep -E '^(whole|halves|flat|tokens)' $OUT/trace_probe.log
MLXCEL_KERNELS=fused MLXCEL_POISON_OUTPUTS=nan timeout $((585 - SECONDS)) python3 -m pytest -q -p no:cacheprovider -rf \
  tests/test_engine.py -k "whole or traced" > $OUT/tests.log 2>&1
echo "tests exit $? at $SECONDS s"; grep -E "^FAILED|^ERROR|passed|failed" $OUT/tests.log | tail -12
