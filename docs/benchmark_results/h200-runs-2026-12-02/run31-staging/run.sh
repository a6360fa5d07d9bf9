# The partial kernel's staging before and after f860209, and main with split score chains, side by side in one
# process (probe.py); ncu's warp-state and stall-sampling sections over a fused cascade step at 8192 x 32 (level 0
# and the private level); the level-0 launch sweep at that cell. First, here (the device has no git):
#   git show 910c925:kernels/cuda.py > docs/benchmark_results/h200-runs-2026-12-02/run31-staging/cuda_910c925.py
# (the probe's "old" source; not kept in the tree). Device call: carry .whl-b .whl-lm after a call that copied
# .whl-a into /tmp/w.
set -u
RUN=docs/benchmark_results/h200-runs-2026-12-02/run31-staging
if ! PYTHONPATH=/tmp/site python3 -c "import mlx.core, mlx_lm" 2>/dev/null; then
  cp .whl-b/* /tmp/w/ && cat /tmp/w/part.* > /tmp/w/mlx_cuda_13-0.32.4-py3-none-manylinux_2_35_x86_64.whl && rm /tmp/w/part.*
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site /tmp/w/*.whl .whl-lm/*.whl || exit 1
fi
mkdir -p /tmp/mlxcel-shim/mlxcel && ln -sfn $PWD/engine /tmp/mlxcel-shim/mlxcel/engine && ln -sfn $PWD/kernels /tmp/mlxcel-shim/mlxcel/kernels
export PYTHONPATH=/tmp/site:/tmp/mlxcel-shim:$PWD:$PWD/tests:$PWD/benchmarks:$PWD/$RUN PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
export MLX_PTX_CACHE_DIR=/tmp/ptx
echo "installed at $SECONDS s"
timeout 260 python3 $RUN/probe.py $OUT > $OUT/probe.log 2>&1; echo "probe exit $? at $SECONDS s"; cat $OUT/probe.md
timeout 120 ncu --clock-control none --section SpeedOfLight --section WarpStateStats --section SourceCounters \
  --section Occupancy --print-details all -k regex:partial -c 2 python3 $RUN/ncu_cascade.py > $OUT/ncu_cascade.txt 2>&1
echo "ncu exit $? at $SECONDS s"
grep -iE "partial_|Duration|Issued Warp|Eligible Warps|Warp Cycles Per Issued|stall|barrier|scoreboard|throttle" \
  $OUT/ncu_cascade.txt | cut -c1-150 | head -60
timeout $((570 - SECONDS)) python3 benchmarks/gpu_attention_bench.py --out $OUT/sweep --shared "" --sweep \
  --sweep-cells 8192x32 --tail 96 > $OUT/sweep.log 2>&1
echo "sweep exit $? at $SECONDS s"; grep "^| 8192" $OUT/sweep/attention_bench.md | head -40
