# The folded launches: the kernel's GPU numerics tests (its nvcc compile tests run on the CPU), the engine's
# folding and traced-cascade tests, then the step profile (per-kernel GPU time of a cascade and a flat step).
# Device call: carry .whl-b .whl-lm after a call that copied .whl-a into /tmp/w.
set -u
if ! PYTHONPATH=/tmp/site python3 -c "import mlx.core, mlx_lm" 2>/dev/null; then
  cp .whl-b/* /tmp/w/ && cat /tmp/w/part.* > /tmp/w/mlx_cuda_13-0.32.4-py3-none-manylinux_2_35_x86_64.whl && rm /tmp/w/part.*
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site /tmp/w/*.whl .whl-lm/*.whl || exit 1
fi
mkdir -p /tmp/mlxcel-shim/mlxcel && ln -sfn $PWD/engine /tmp/mlxcel-shim/mlxcel/engine && ln -sfn $PWD/kernels /tmp/mlxcel-shim/mlxcel/kernels
export PYTHONPATH=/tmp/site:/tmp/mlxcel-shim:$PWD:$PWD/tests:$PWD/benchmarks PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
export MLX_PTX_CACHE_DIR=/tmp/ptx
echo "installed at $SECONDS s"
MLXCEL_KERNELS=fused timeout 120 python3 -m pytest -q -p no:cacheprovider -rf tests/test_cuda_matmul.py \
  -k "not compiles" > $OUT/tests.log 2>&1
echo "kernel tests exit $? at $SECONDS s"; grep -E "^FAILED|^ERROR|passed|failed" $OUT/tests.log | tail -8
MLXCEL_KERNELS=fused timeout 100 python3 -m pytest -q -p no:cacheprovider -rf tests/test_engine.py \
  -k "folding" >> $OUT/tests.log 2>&1
echo "engine tests exit $? at $SECONDS s"; grep -E "^FAILED|^ERROR|passed|failed" $OUT/tests.log | tail -4
timeout $((570 - SECONDS)) python3 benchmarks/gpu_step_profile.py --out /tmp/profile > $OUT/profile.log 2>&1
echo "profile exit $? at $SECONDS s"; cp /tmp/profile/step_profile.* $OUT/ 2>/dev/null; cat $OUT/step_profile.md
tail -3 $OUT/profile.log
