# The partial kernel's staging with slot checks only in a row's end chunks and one 64-bit product a page
# (its float64 GPU tests), then the o_proj weight started into the L2 cache by the head split during the
# attention, policies none / normal / last side by side (probe.py), then the e2e bench (cascade, flat ABBA,
# mlx-lm) with the probe's best policy. Device call: carry .whl-b .whl-lm after a call that copied .whl-a
# into /tmp/w.
set -u
RUN=docs/benchmark_results/h200-runs-2026-12-02/run30-prefetch
if ! PYTHONPATH=/tmp/site python3 -c "import mlx.core, mlx_lm" 2>/dev/null; then
  cp .whl-b/* /tmp/w/ && cat /tmp/w/part.* > /tmp/w/mlx_cuda_13-0.32.4-py3-none-manylinux_2_35_x86_64.whl && rm /tmp/w/part.*
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site /tmp/w/*.whl .whl-lm/*.whl || exit 1
fi
mkdir -p /tmp/mlxcel-shim/mlxcel && ln -sfn $PWD/engine /tmp/mlxcel-shim/mlxcel/engine && ln -sfn $PWD/kernels /tmp/mlxcel-shim/mlxcel/kernels
export PYTHONPATH=/tmp/site:/tmp/mlxcel-shim:$PWD:$PWD/tests:$PWD/benchmarks PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
export MLX_PTX_CACHE_DIR=/tmp/ptx
echo "installed at $SECONDS s"
MLXCEL_KERNELS=fused MLXCEL_POISON_OUTPUTS=nan timeout 120 python3 -m pytest -q -p no:cacheprovider -rf \
  tests/test_fused_kernels.py -k "level0_staging_rings or long_rows or straddles" > $OUT/tests.log 2>&1
echo "kernel tests exit $? at $SECONDS s"; grep -E "^FAILED|^ERROR|passed|failed" $OUT/tests.log | tail -6
timeout 200 python3 $RUN/probe.py $OUT > $OUT/probe.log 2>&1; echo "probe exit $? at $SECONDS s"; cat $OUT/probe.md
grep -o '"policy": "[a-z]*"\|"tokens_agree": {[^}]*}' $OUT/probe.log | paste - - | head -6
BEST=$(cat $OUT/best 2>/dev/null || echo none); echo "best: $BEST"
MLXCEL_L2_PREFETCH=$BEST timeout $((585 - SECONDS)) python3 benchmarks/gpu_e2e_bench.py --out /tmp/e2e > $OUT/e2e.log 2>&1
echo "e2e exit $? at $SECONDS s"; cp /tmp/e2e/e2e_bench.json /tmp/e2e/e2e_bench.md $OUT/ 2>/dev/null
grep "^| " $OUT/e2e_bench.md; grep -A3 '"cascade_vs_flat_tokens"\|"flat_vs_mlx_lm_tokens"' $OUT/e2e_bench.json | head -12
