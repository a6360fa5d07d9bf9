# Level 0 on the warpgroup kernel with two warpgroups a block, the fold's level states loaded first: the GPU
# tests of what changed (the warpgroup level, cascade steps with and without the merge launch, the engine,
# forests), then the in-process A/B of one and two warpgroups a block (probe.py). Device call: carry .whl-b
# .whl-lm after a call that copied .whl-a into /tmp/w.
set -u
RUN=docs/benchmark_results/h200-runs-2026-12-02/run37-two-warpgroups
if ! PYTHONPATH=/tmp/site python3 -c "import mlx.core, mlx_lm" 2>/dev/null; then
  cp .whl-b/* /tmp/w/ && cat /tmp/w/part.* > /tmp/w/mlx_cuda_13-0.32.4-py3-none-manylinux_2_35_x86_64.whl && rm /tmp/w/part.*
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site /tmp/w/*.whl .whl-lm/*.whl || exit 1
fi
mkdir -p /tmp/mlxcel-shim/mlxcel && ln -sfn $PWD/engine /tmp/mlxcel-shim/mlxcel/engine && ln -sfn $PWD/kernels /tmp/mlxcel-shim/mlxcel/kernels
export PYTHONPATH=/tmp/site:/tmp/mlxcel-shim:$PWD:$PWD/tests:$PWD/benchmarks PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
export MLX_PTX_CACHE_DIR=/tmp/ptx
echo "installed at $SECONDS s"
MLXCEL_KERNELS=fused timeout 200 python3 -m pytest -q -p no:cacheprovider -rf tests/test_fused_kernels.py \
  -k "warpgroup or with_and_without_lookups or engine_cascade or (forest_cascade_on_the and (dtype0 or int8))" \
  > $OUT/tests.log 2>&1
echo "kernel tests exit $? at $SECONDS s"; grep -E "^FAILED|^ERROR|passed|failed|Error" $OUT/tests.log | tail -8
timeout 200 python3 $RUN/probe.py $OUT > $OUT/probe.log 2>&1; echo "probe exit $? at $SECONDS s"; cat $OUT/probe.md
tail -3 $OUT/probe.log
