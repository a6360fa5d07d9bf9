# Level 0's staging ring (2, 3 or 4 chunks): the kernels' float64 tests of each ring, the cascade step swept
# over ring and tile width at 8192 shared x 32 (tail 80, about the e2e bench's private length), then the e2e
# bench (cascade, flat ABBA, mlx-lm) with the sweep's best ring at the default tiles. Device call: carry
# .whl-b .whl-lm after a call that copied .whl-a into /tmp/w.
set -u
RUN=docs/benchmark_results/h200-runs-2026-12-02/run26-rings
if ! PYTHONPATH=/tmp/site python3 -c "import mlx.core, mlx_lm" 2>/dev/null; then
  cp .whl-b/* /tmp/w/ && cat /tmp/w/part.* > /tmp/w/mlx_cuda_13-0.32.4-py3-none-manylinux_2_35_x86_64.whl && rm /tmp/w/part.*
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site /tmp/w/*.whl .whl-lm/*.whl || exit 1
fi
mkdir -p /tmp/mlxcel-shim/mlxcel && ln -sfn $PWD/engine /tmp/mlxcel-shim/mlxcel/engine && ln -sfn $PWD/kernels /tmp/mlxcel-shim/mlxcel/kernels
export PYTHONPATH=/tmp/site:/tmp/mlxcel-shim:$PWD:$PWD/tests:$PWD/benchmarks PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
export MLX_PTX_CACHE_DIR=/tmp/ptx
echo "installed at $SECONDS s"
MLXCEL_KERNELS=fused MLXCEL_POISON_OUTPUTS=nan timeout 110 python3 -m pytest -q -p no:cacheprovider -rf \
  tests/test_fused_kernels.py -k "level0_staging_rings or long_rows" > $OUT/tests.log 2>&1
echo "kernel tests exit $? at $SECONDS s"; grep -E "^FAILED|^ERROR|passed|failed" $OUT/tests.log | tail -6
timeout 150 python3 benchmarks/gpu_attention_bench.py --out $OUT/sweep --shared "" --sweep --sweep-cells 8192x32 \
  --sweep-stages 2,3,4 --sweep-stages-only --tail 80 > $OUT/sweep.log 2>&1
echo "sweep exit $? at $SECONDS s"; grep "^| " $OUT/sweep/attention_bench.md
STAGES=$(python3 -c "
import json; rows = json.load(open('$OUT/sweep/attention_bench.json'))['level0_sweep']
print(min((r for r in rows if r['level0_pages'] is None), key=lambda r: r['s'])['level0_stages'])" 2>/dev/null || echo 2)
echo "e2e with level0_stages=$STAGES"
timeout $((560 - SECONDS)) python3 $RUN/with_level0_stages.py $STAGES benchmarks/gpu_e2e_bench.py --out /tmp/e2e \
  > $OUT/e2e.log 2>&1; echo "e2e exit $? at $SECONDS s"
cp /tmp/e2e/e2e_bench.json /tmp/e2e/e2e_bench.md $OUT/ 2>/dev/null; grep "^| " $OUT/e2e_bench.md
grep -A3 '"cascade_vs_flat_tokens"\|"flat_vs_mlx_lm_tokens"' $OUT/e2e_bench.json | head -12; tail -2 $OUT/e2e.log
