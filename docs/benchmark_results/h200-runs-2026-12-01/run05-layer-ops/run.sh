# Decode-step issue, fifth H200 run: the layer ops (residual add + RMS norm, q/k/v split + q/k norms + rope) as
# one CUDA kernel each. Their tests against float64 on the GPU, the decode path's GPU tests, then the step profile
# with each arm also run on MLX's own ops for the layer ops (MLXCEL_LAYER_OPS=composed), side by side.
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
