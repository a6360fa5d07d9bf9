# Where a cascade step's attention launches spend their cycles: ncu's full set with per-instruction stall
# samples over level 0 (warpgroup kernel) and the private level merging, at 8192 shared x 32 (tail 96); then
# the level-0 tile width sweep on the warpgroup kernel (its default was measured on the mma.sync kernel).
# Device call: carry .whl-b .whl-lm after a call that copied .whl-a into /tmp/w.
set -u
RUN=docs/benchmark_results/h200-runs-2026-12-02/run41-profile
if ! PYTHONPATH=/tmp/site python3 -c "import mlx.core, mlx_lm" 2>/dev/null; then
  cp .whl-b/* /tmp/w/ && cat /tmp/w/part.* > /tmp/w/mlx_cuda_13-0.32.4-py3-none-manylinux_2_35_x86_64.whl && rm /tmp/w/part.*
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site /tmp/w/*.whl .whl-lm/*.whl || exit 1
fi
mkdir -p /tmp/mlxcel-shim/mlxcel && ln -sfn $PWD/engine /tmp/mlxcel-shim/mlxcel/engine && ln -sfn $PWD/kernels /tmp/mlxcel-shim/mlxcel/kernels
export PYTHONPATH=/tmp/site:/tmp/mlxcel-shim:$PWD:$PWD/tests:$PWD/benchmarks:$PWD/$RUN PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
export MLX_PTX_CACHE_DIR=/tmp/ptx
echo "installed at $SECONDS s"
timeout 200 ncu --set full --import-source yes -k regex:"warpgroup_partial|merged_partial" -c 2 \
  -o /tmp/cascade python3 $RUN/ncu_cascade.py > $OUT/ncu.log 2>&1
echo "ncu exit $? at $SECONDS s"; tail -3 $OUT/ncu.log
ncu -i /tmp/cascade.ncu-rep --print-details all > $OUT/ncu_details.txt 2>&1
ncu -i /tmp/cascade.ncu-rep --page source --csv --print-source sass > $OUT/ncu_source.csv 2>&1
echo "exports at $SECONDS s"; wc -c $OUT/ncu_source.csv
grep -E "partial_|Duration|Registers Per|Achieved Occ|Theoretical Occ|Warp Cycles Per Issued|Issued Warp" \
  $OUT/ncu_details.txt | cut -c1-150 | head -24
timeout $((560 - SECONDS)) python3 benchmarks/gpu_attention_bench.py --out /tmp/sweep --shared "" --sweep \
  --sweep-cells 8192x32 --tail 96 --sweep-stages-only > $OUT/sweep.log 2>&1
echo "sweep exit $? at $SECONDS s"; cp /tmp/sweep/attention_bench.md $OUT/sweep.md 2>/dev/null
grep "^| 8192" $OUT/sweep.md | head -20; tail -3 $OUT/sweep.log
