# The read of main after the fold and the Q-after change were reverted (kernels as a26c1d1, run 38's code):
# the e2e bench (cascade, flat ABBA, mlx-lm), the step profile, then the attention kernels' GPU tests.
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
timeout 230 python3 benchmarks/gpu_e2e_bench.py --out /tmp/e2e > $OUT/e2e.log 2>&1
echo "e2e exit $? at $SECONDS s"; cp /tmp/e2e/e2e_bench.json /tmp/e2e/e2e_bench.md $OUT/ 2>/dev/null
grep "^| " $OUT/e2e_bench.md; grep -A3 '"cascade_vs_flat_tokens"\|"flat_vs_mlx_lm_tokens"' $OUT/e2e_bench.json | head -12
timeout $((400 - SECONDS)) python3 benchmarks/gpu_step_profile.py --out /tmp/sp > $OUT/step_profile.log 2>&1
echo "profile exit $? at $SECONDS s"; cp /tmp/sp/* $OUT/ 2>/dev/null; ls $OUT; tail -4 $OUT/step_profile.log | cut -c1-300
MLXCEL_KERNELS=fused timeout $((560 - SECONDS)) python3 -m pytest -q -p no:cacheprovider -rf tests/test_fused_kernels.py \
  -k "level0_on_warpgroup or stacked_heads or with_and_without_lookups or engine_cascade" > $OUT/tests.log 2>&1
echo "kernel tests exit $? at $SECONDS s"; grep -E "^FAILED|^ERROR|passed|failed|Error" $OUT/tests.log | tail -8
