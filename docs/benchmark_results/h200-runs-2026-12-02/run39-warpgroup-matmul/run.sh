# Ran the code of commit 116a626 (reverted: the warpgroup kernel ran slower than the mma.sync one).
# The skinny matmul on warpgroup MMA: its GPU tests against float64 (both kernels), the matmul bench at 32 rows
# (cuBLAS, the mma.sync kernel, the warpgroup kernel; each kernel's launch with the engine's folded epilogue),
# then the e2e bench (cascade steps on the warpgroup kernel). Device call: carry .whl-b .whl-lm after a call
# that copied .whl-a into /tmp/w.
set -u
if ! PYTHONPATH=/tmp/site python3 -c "import mlx.core, mlx_lm" 2>/dev/null; then
  cp .whl-b/* /tmp/w/ && cat /tmp/w/part.* > /tmp/w/mlx_cuda_13-0.32.4-py3-none-manylinux_2_35_x86_64.whl && rm /tmp/w/part.*
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site /tmp/w/*.whl .whl-lm/*.whl || exit 1
fi
mkdir -p /tmp/mlxcel-shim/mlxcel && ln -sfn $PWD/engine /tmp/mlxcel-shim/mlxcel/engine && ln -sfn $PWD/kernels /tmp/mlxcel-shim/mlxcel/kernels
export PYTHONPATH=/tmp/site:/tmp/mlxcel-shim:$PWD:$PWD/tests:$PWD/benchmarks PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
export MLX_PTX_CACHE_DIR=/tmp/ptx
echo "installed at $SECONDS s"
timeout 150 python3 -m pytest -q -x -p no:cacheprovider -rf tests/test_cuda_matmul.py -k "warpgroup or sweep" \
  > $OUT/tests.log 2>&1
echo "warpgroup tests exit $? at $SECONDS s"; grep -E "^FAILED|^ERROR|passed|failed|Error|assert" $OUT/tests.log | tail -12
timeout 120 python3 benchmarks/gpu_matmul_bench.py --out /tmp/mm --rows 32 > $OUT/matmul.log 2>&1
echo "matmul exit $? at $SECONDS s"; cp /tmp/mm/matmul.md /tmp/mm/matmul.json $OUT/ 2>/dev/null; cat $OUT/matmul.md
tail -3 $OUT/matmul.log
timeout $((560 - SECONDS)) python3 benchmarks/gpu_e2e_bench.py --out /tmp/e2e > $OUT/e2e.log 2>&1
echo "e2e exit $? at $SECONDS s"; cp /tmp/e2e/e2e_bench.json /tmp/e2e/e2e_bench.md $OUT/ 2>/dev/null
grep "^| " $OUT/e2e_bench.md; grep -A3 '"cascade_vs_flat_tokens"\|"flat_vs_mlx_lm_tokens"' $OUT/e2e_bench.json | head -12
tail -3 $OUT/e2e.log
