# Final H200 run of the session, part 1 (after the forest, API, dashboard and tensor-parallel merges): the GPU
# tests of the fused kernels (forests, the cost model, the layer ops) and the engine, then the forest bench with
# FlashInfer's multi-level wrapper beside ours.
# Device call: carry .whl-b .whl-lm .fi-bundle after a call that copied .whl-a into /tmp/w.
set -u
cp .whl-b/* /tmp/w/ && cat /tmp/w/part.* > /tmp/w/mlx_cuda_13-0.32.4-py3-none-manylinux_2_35_x86_64.whl && rm /tmp/w/part.*
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site /tmp/w/*.whl .whl-lm/*.whl || exit 1
bash .fi-bundle/install.sh /tmp/fisite > $OUT/fi-install.log 2>&1; echo "flashinfer install exit $?"
mkdir -p /tmp/mlxcel-shim/mlxcel && ln -sfn $PWD/engine /tmp/mlxcel-shim/mlxcel/engine && ln -sfn $PWD/kernels /tmp/mlxcel-shim/mlxcel/kernels
export PYTHONPATH=/tmp/site:/tmp/mlxcel-shim:$PWD:$PWD/tests:$PWD/benchmarks PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
MLXCEL_KERNELS=fused MLXCEL_POISON_OUTPUTS=nan timeout 230 python3 -m pytest -q -p no:cacheprovider \
  tests/test_fused_kernels.py tests/test_cost_model.py tests/test_cascade_planner.py tests/test_layer_ops.py \
  tests/test_engine.py tests/test_pipeline.py > $OUT/tests.log 2>&1
echo "tests exit $? at $SECONDS s"; grep -E "^FAILED|^ERROR|passed|failed" $OUT/tests.log | tail -12
PYTHONPATH=/tmp/fisite:$PYTHONPATH CUDA_HOME=${CUDA_HOME:-/usr/local/cuda} timeout $((585 - SECONDS)) \
  python3 benchmarks/gpu_forest_bench.py --out /tmp/forest > $OUT/forest.log 2>&1
echo "forest exit $? at $SECONDS s"; cp /tmp/forest/forest_bench.json /tmp/forest/forest_bench.md $OUT/ 2>/dev/null
cat $OUT/forest_bench.md 2>/dev/null | head -30; tail -5 $OUT/forest.log
