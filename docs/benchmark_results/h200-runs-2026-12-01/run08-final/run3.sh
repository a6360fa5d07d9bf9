# Final H200 run, part 3 (a fresh machine): the GPU tests part 1 did not reach in its time limit (the cost
# model's, the engine's and the pipeline's), then the tensor-parallel bench's one-GPU smoke (NCCL, one rank).
# Device call: carry .whl-b .whl-lm after a call that copied .whl-a into /tmp/w.
set -u
cp .whl-b/* /tmp/w/ && cat /tmp/w/part.* > /tmp/w/mlx_cuda_13-0.32.4-py3-none-manylinux_2_35_x86_64.whl && rm /tmp/w/part.*
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site /tmp/w/*.whl .whl-lm/*.whl || exit 1
mkdir -p /tmp/mlxcel-shim/mlxcel && ln -sfn $PWD/engine /tmp/mlxcel-shim/mlxcel/engine && ln -sfn $PWD/kernels /tmp/mlxcel-shim/mlxcel/kernels
export PYTHONPATH=/tmp/site:/tmp/mlxcel-shim:$PWD:$PWD/tests:$PWD/benchmarks PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
MLXCEL_KERNELS=fused MLXCEL_POISON_OUTPUTS=nan timeout 200 python3 -m pytest -q -p no:cacheprovider -rf \
  tests/test_cost_model.py tests/test_fused_kernels.py::test_fused_launches_per_step_do_not_grow_with_the_groups \
  tests/test_engine.py tests/test_pipeline.py > $OUT/tests.log 2>&1
echo "tests exit $? at $SECONDS s"; grep -E "^FAILED|^ERROR|passed|failed" $OUT/tests.log | tail -8
NCCL_NVLS_ENABLE=0 timeout $((290 - SECONDS)) python3 benchmarks/gpu_tp_bench.py --out /tmp/tp --ranks 1 \
  --num-layers 8 --sessions 8 --shared 2048 --bandwidth-gib 1 > $OUT/tp.log 2>&1
echo "tp smoke exit $? at $SECONDS s"; tail -6 $OUT/tp.log; cp /tmp/tp/*.json $OUT/ 2>/dev/null; ls $OUT
