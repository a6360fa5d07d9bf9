# The skinny matmul's x through L1 (cp.async.ca) against L2 only, at launch shapes of one to three blocks an SM
# (probe.py), then ncu over the shipped launches and over a fused cascade step at 8192 x 32. Device call: carry
# .whl-b .whl-lm after a call that copied .whl-a into /tmp/w.
set -u
RUN=docs/benchmark_results/h200-runs-2026-12-02/run27-x-l1
if ! PYTHONPATH=/tmp/site python3 -c "import mlx.core, mlx_lm" 2>/dev/null; then
  cp .whl-b/* /tmp/w/ && cat /tmp/w/part.* > /tmp/w/mlx_cuda_13-0.32.4-py3-none-manylinux_2_35_x86_64.whl && rm /tmp/w/part.*
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site /tmp/w/*.whl .whl-lm/*.whl || exit 1
fi
mkdir -p /tmp/mlxcel-shim/mlxcel && ln -sfn $PWD/engine /tmp/mlxcel-shim/mlxcel/engine && ln -sfn $PWD/kernels /tmp/mlxcel-shim/mlxcel/kernels
export PYTHONPATH=/tmp/site:/tmp/mlxcel-shim:$PWD:$PWD/tests:$PWD/benchmarks:$PWD/$RUN PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
export MLX_PTX_CACHE_DIR=/tmp/ptx
echo "installed at $SECONDS s"
timeout 200 python3 $RUN/probe.py $OUT > $OUT/probe.log 2>&1; echo "probe exit $? at $SECONDS s"; cat $OUT/probe.md
NCU="ncu --clock-control none --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats
  --section SchedulerStats --section Occupancy --section LaunchStats
  --metrics dram__bytes_read.sum,lts__t_sectors_srcunit_tex_op_read.sum,l1tex__t_sector_hit_rate.pct"
timeout 150 $NCU -k regex:skinny python3 $RUN/probe.py /tmp/probe-ncu --ncu > $OUT/ncu_matmul.txt 2>&1
echo "ncu matmul exit $? at $SECONDS s"
grep -E "skinny_matmul|Duration|DRAM Throughput|L2 Cache Throughput|dram__bytes_read|lts__t_sectors|sector_hit" \
  $OUT/ncu_matmul.txt | head -80
timeout 120 $NCU -k regex:partial python3 $RUN/ncu_cascade.py > $OUT/ncu_cascade.txt 2>&1
echo "ncu cascade exit $? at $SECONDS s"
grep -E "partial_|Duration|DRAM Throughput|L2 Cache Throughput|Issued Warp|Eligible Warps|Active Warps" \
  $OUT/ncu_cascade.txt | head -40
