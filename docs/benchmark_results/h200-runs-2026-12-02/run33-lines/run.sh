# The skinny matmul copying whole 128-byte lines of each row (eight lanes a row, each piece into its reading
# lane's slot): its float64 GPU tests, the matmul bench against cuBLAS at 32 rows, the e2e bench (cascade, flat
# ABBA, mlx-lm) and the step profile. Device call: carry .whl-b .whl-lm after a call that copied .whl-a into /tmp/w.
# The kernel as of commit 618d492 (reverted after runs 33-34).
set -u
if ! PYTHONPATH=/tmp/site python3 -c "import mlx.core, mlx_lm" 2>/dev/null; then
  cp .whl-b/* /tmp/w/ && cat /tmp/w/part.* > /tmp/w/mlx_cuda_13-0.32.4-py3-none-manylinux_2_35_x86_64.whl && rm /tmp/w/part.*
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site /tmp/w/*.whl .whl-lm/*.whl || exit 1
fi
mkdir -p /tmp/mlxcel-shim/mlxcel && ln -sfn $PWD/engine /tmp/mlxcel-shim/mlxcel/engine && ln -sfn $PWD/kernels /tmp/mlxcel-shim/mlxcel/kernels
export PYTHONPATH=/tmp/site:/tmp/mlxcel-shim:$PWD:$PWD/tests:$PWD/benchmarks PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
export MLX_PTX_CACHE_DIR=/tmp/ptx
echo "installed at $SECONDS s"
MLXCEL_KERNELS=fused timeout 130 python3 -m pytest -q -p no:cacheprovider -rf tests/test_cuda_matmul.py \
  -k "swiglu_of or norm_on_the or residual_add or every_launch_shape or products_match" \
  --deselect tests/test_cuda_matmul.py::test_the_kernel_compiles_without_spills_in_its_shared_memory > $OUT/tests.log 2>&1
echo "kernel tests exit $? at $SECONDS s"; grep -E "^FAILED|^ERROR|passed|failed" $OUT/tests.log | tail -6
timeout 60 python3 benchmarks/gpu_matmul_bench.py --out /tmp/matmul --rows 32 > $OUT/matmul.log 2>&1
echo "matmul exit $? at $SECONDS s"; cp /tmp/matmul/matmul.md $OUT/ 2>/dev/null; cat $OUT/matmul.md
timeout 220 python3 benchmarks/gpu_e2e_bench.py --out /tmp/e2e > $OUT/e2e.log 2>&1; echo "e2e exit $? at $SECONDS s"
cp /tmp/e2e/e2e_bench.json /tmp/e2e/e2e_bench.md $OUT/ 2>/dev/null; grep "^| " $OUT/e2e_bench.md
grep -A4 '"cascade_vs_flat_tokens"\|"flat_vs_mlx_lm_tokens"' $OUT/e2e_bench.json | head -14; tail -2 $OUT/e2e.log
timeout $((585 - SECONDS)) python3 benchmarks/gpu_step_profile.py --out /tmp/profile > $OUT/profile.log 2>&1
echo "profile exit $? at $SECONDS s"; cp /tmp/profile/step_profile.json $OUT/ 2>/dev/null
cp /tmp/profile/step_profile.md $OUT/profile.md 2>/dev/null
grep -E "^\| (cascade|flat) |skinny|partial|split_heads|merge" $OUT/profile.md
