# Decode-step issue, seventh H200 run: the layer ops as one CUDA kernel each, the q/k/v one storing k and v into
# the pool itself in decode steps the fused kernels serve (run 6 stored in every step: the gather read stale K/V).
# Their tests against float64 on the GPU, the decode path's GPU tests, the step profile with each
# arm also on MLX's own ops for the layer ops (MLXCEL_LAYER_OPS=composed), then the end-to-end bench.
# Device call: carry .whl-b .whl-lm after a call that copied .whl-a into /tmp/w.
set -u
cp .whl-b/* /tmp/w/ && cat /tmp/w/part.* > /tmp/w/mlx_cuda_13-0.32.4-py3-none-manylinux_2_35_x86_64.whl && rm /tmp/w/part.*
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site /tmp/w/*.whl .whl-lm/*.whl || exit 1
mkdir -p /tmp/mlxcel-shim/mlxcel && ln -sfn $PWD/engine /tmp/mlxcel-shim/mlxcel/engine && ln -sfn $PWD/kernels /tmp/mlxcel-shim/mlxcel/kernels
export PYTHONPATH=/tmp/site:/tmp/mlxcel-shim:$PWD:$PWD/tests:$PWD/benchmarks PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
MLXCEL_KERNELS=fused MLXCEL_POISON_OUTPUTS=nan timeout 200 python3 -m pytest -q -x -p no:cacheprovider \
  tests/test_layer_ops.py tests/test_engine.py tests/test_pipeline.py tests/test_attention.py > $OUT/tests.log 2>&1
echo "tests exit $? at $SECONDS s"; tail -3 $OUT/tests.log
timeout $((560 - SECONDS)) python3 benchmarks/gpu_step_profile.py --out /tmp/prof --compare-layer-ops > $OUT/profile.log 2>&1
echo "profile exit $? at $SECONDS s"; cp /tmp/prof/step_profile.json /tmp/prof/step_profile.md $OUT/ 2>/dev/null
grep "^| \|^tokens" $OUT/step_profile.md; tail -3 $OUT/profile.log
timeout $((590 - SECONDS)) python3 benchmarks/gpu_e2e_bench.py --out /tmp/e2e > $OUT/e2e.log 2>&1; echo "e2e exit $? at $SECONDS s"
cp /tmp/e2e/e2e_bench.json /tmp/e2e/e2e_bench.md $OUT/ 2>/dev/null; grep "^| " $OUT/e2e_bench.md; tail -4 $OUT/e2e.log
