# The partial and warpgroup kernels' Q loaded once the first chunks' copies are issued (with the fold of
# run 42): their GPU tests, the cascade step in three kernel states side by side (probe.py), then the e2e
# bench (cascade, flat ABBA, mlx-lm) on the working tree.
# Device call: carry .whl-b .whl-lm after a call that copied .whl-a into /tmp/w.
set -u
RUN=docs/benchmark_results/h200-runs-2026-12-02/run43-q-after
if ! PYTHONPATH=/tmp/site python3 -c "import mlx.core, mlx_lm" 2>/dev/null; then
  cp .whl-b/* /tmp/w/ && cat /tmp/w/part.* > /tmp/w/mlx_cuda_13-0.32.4-py3-none-manylinux_2_35_x86_64.whl && rm /tmp/w/part.*
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site /tmp/w/*.whl .whl-lm/*.whl || exit 1
fi
mkdir -p /tmp/mlxcel-shim/mlxcel && ln -sfn $PWD/engine /tmp/mlxcel-shim/mlxcel/engine && ln -sfn $PWD/kernels /tmp/mlxcel-shim/mlxcel/kernels
export PYTHONPATH=/tmp/site:/tmp/mlxcel-shim:$PWD:$PWD/tests:$PWD/benchmarks:$PWD/$RUN PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
export MLX_PTX_CACHE_DIR=/tmp/ptx
echo "installed at $SECONDS s"
MLXCEL_KERNELS=fused timeout $((200 - SECONDS)) python3 -m pytest -q -p no:cacheprovider -rf tests/test_fused_kernels.py \
  -k "level0_on_warpgroup or stacked_heads or half_precision or quantized_pools or with_and_without_lookups or engine_cascade" \
  > $OUT/tests.log 2>&1
echo "kernel tests exit $? at $SECONDS s"; grep -E "^FAILED|^ERROR|passed|failed|Error" $OUT/tests.log | tail -8
timeout $((370 - SECONDS)) python3 $RUN/probe.py $OUT > $OUT/probe.log 2>&1; echo "probe exit $? at $SECONDS s"
cat $OUT/probe.md; tail -2 $OUT/probe.log | cut -c1-300
timeout $((585 - SECONDS)) python3 benchmarks/gpu_e2e_bench.py --out /tmp/e2e > $OUT/e2e.log 2>&1
echo "e2e exit $? at $SECONDS s"; cp /tmp/e2e/e2e_bench.json /tmp/e2e/e2e_bench.md $OUT/ 2>/dev/null
grep "^| " $OUT/e2e_bench.md; grep -A3 '"cascade_vs_flat_tokens"\|"flat_vs_mlx_lm_tokens"' $OUT/e2e_bench.json | head -12
