# The final tree: the end-to-end bench with mlx-lm (ABBA), then the step profile (GPU busy, kernels per step).
# Device call: carry .whl-b .whl-lm after a call that copied .whl-a into /tmp/w.
set -u
cp .whl-b/* /tmp/w/ && cat /tmp/w/part.* > /tmp/w/mlx_cuda_13-0.32.4-py3-none-manylinux_2_35_x86_64.whl && rm /tmp/w/part.*
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site /tmp/w/*.whl .whl-lm/*.whl || exit 1
mkdir -p /tmp/mlxcel-shim/mlxcel && ln -sfn $PWD/engine /tmp/mlxcel-shim/mlxcel/engine && ln -sfn $PWD/kernels /tmp/mlxcel-shim/mlxcel/kernels
export PYTHONPATH=/tmp/site:/tmp/mlxcel-shim:$PWD:$PWD/tests:$PWD/benchmarks PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
export MLX_PTX_CACHE_DIR=/tmp/ptx
echo "installed at $SECONDS s"
timeout 200 python3 benchmarks/gpu_e2e_bench.py --out /tmp/e2e > $OUT/e2e.log 2>&1; echo "e2e exit $? at $SECONDS s"
cp /tmp/e2e/e2e_bench.json /tmp/e2e/e2e_bench.md $OUT/ 2>/dev/null; grep "^| " $OUT/e2e_bench.md
timeout $((560 - SECONDS)) python3 benchmarks/gpu_step_profile.py --out /tmp/prof > $OUT/profile.log 2>&1
echo "profile exit $? at $SECONDS s"; cp /tmp/prof/step_profile.* $OUT/ 2>/dev/null; head -8 $OUT/step_profile.md
