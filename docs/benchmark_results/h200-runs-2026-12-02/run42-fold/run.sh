# The warp-cooperative fold of the levels' states: its GPU tests (merge, cascade, the engine's cascade), the
# cascade step with the fold before and after it side by side (probe.py), and the skinny matmul's launch
# shapes with a ring of two chunks a warp (more warps, or more blocks, an SM) against the picked ones.
# Device call: carry .whl-b .whl-lm after a call that copied .whl-a into /tmp/w.
set -u
RUN=docs/benchmark_results/h200-runs-2026-12-02/run42-fold
if ! PYTHONPATH=/tmp/site python3 -c "import mlx.core, mlx_lm" 2>/dev/null; then
  cp .whl-b/* /tmp/w/ && cat /tmp/w/part.* > /tmp/w/mlx_cuda_13-0.32.4-py3-none-manylinux_2_35_x86_64.whl && rm /tmp/w/part.*
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site /tmp/w/*.whl .whl-lm/*.whl || exit 1
fi
mkdir -p /tmp/mlxcel-shim/mlxcel && ln -sfn $PWD/engine /tmp/mlxcel-shim/mlxcel/engine && ln -sfn $PWD/kernels /tmp/mlxcel-shim/mlxcel/kernels
export PYTHONPATH=/tmp/site:/tmp/mlxcel-shim:$PWD:$PWD/tests:$PWD/benchmarks:$PWD/$RUN PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
export MLX_PTX_CACHE_DIR=/tmp/ptx
echo "installed at $SECONDS s"
timeout 300 python3 $RUN/probe.py $OUT > $OUT/probe.log 2>&1; echo "probe exit $? at $SECONDS s"
cat $OUT/probe.md; tail -3 $OUT/probe.log
MLXCEL_KERNELS=fused timeout $((440 - SECONDS)) python3 -m pytest -q -p no:cacheprovider -rf tests/test_fused_kernels.py \
  -k "merge_matches or with_and_without_lookups or engine_cascade or long_rows" > $OUT/tests.log 2>&1
C=tests/test_fused_kernels.py::test_cascade_decode_in_three_launches
MLXCEL_KERNELS=fused timeout $((470 - SECONDS)) python3 -m pytest -q -p no:cacheprovider -rf "$C[dtype0-64-4]" \
  "$C[dtype1-8-8]" "$C[int8-64-4]" "$C[int4-2-1]" >> $OUT/tests.log 2>&1
echo "kernel tests exit $? at $SECONDS s"; grep -E "^FAILED|^ERROR|passed|failed|Error" $OUT/tests.log | tail -8
timeout $((580 - SECONDS)) python3 benchmarks/gpu_matmul_bench.py --out /tmp/mm --rows 32 --sweep \
  --sweep-tiles 8x8x2 8x4x2 6x8x2 4x8x2 4x16x2 4x4x2 > $OUT/matmul.log 2>&1
echo "matmul exit $? at $SECONDS s"; cp /tmp/mm/matmul.* $OUT/ 2>/dev/null; grep "^| " $OUT/matmul.md
