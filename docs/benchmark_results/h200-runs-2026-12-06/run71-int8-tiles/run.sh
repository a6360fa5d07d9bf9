# Run 71: int8 pages against bf16 at level-0 tile widths, ring stages and flat widths (probe.py), 8K and 32K x 32.
# Device call: carry .whl-b .whl-lm after a call that copied .whl-a into /tmp/w.
set -u
if ! PYTHONPATH=/tmp/site python3 -c "import mlx.core, mlx_lm" 2>/dev/null; then
  cp .whl-b/* /tmp/w/ && cat /tmp/w/part.* > /tmp/w/mlx_cuda_13-0.32.4-py3-none-manylinux_2_35_x86_64.whl && rm /tmp/w/part.*
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site /tmp/w/*.whl .whl-lm/*.whl || exit 1
fi
mkdir -p /tmp/mlxcel-shim/mlxcel && ln -sfn $PWD/engine /tmp/mlxcel-shim/mlxcel/engine && ln -sfn $PWD/kernels /tmp/mlxcel-shim/mlxcel/kernels
export PYTHONPATH=/tmp/site:/tmp/mlxcel-shim:$PWD:$PWD/tests:$PWD/benchmarks PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
export MLX_PTX_CACHE_DIR=/tmp/ptx
D=docs/benchmark_results/h200-runs-2026-12-06/run71-int8-tiles
echo "installed at $SECONDS s"; nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
timeout 300 python3 $D/probe.py /tmp/probe > $OUT/probe.log 2>&1
echo "probe exit $? at $SECONDS s"; cp /tmp/probe/* $OUT/ 2>/dev/null; cat $OUT/probe.md; tail -5 $OUT/probe.log | cut -c1-400
timeout $((560 - SECONDS)) ncu --set full -k regex:warpgroup -c 4 -o /tmp/level0 python3 $D/ncu_level0.py > $OUT/ncu.log 2>&1
echo "ncu exit $? at $SECONDS s"; tail -2 $OUT/ncu.log
ncu -i /tmp/level0.ncu-rep --print-details all > $OUT/ncu_details.txt 2>&1; gzip $OUT/ncu_details.txt
zcat $OUT/ncu_details.txt.gz | grep -E "^  [a-z_]+|Duration|DRAM Throughput|Memory Throughput|Registers Per|Achieved Occ|Block Limit|Dynamic Shared|No Eligible|Stall (Wait|Long|Barrier|Short|MIO|LG|Math|GMMA)" | cut -c1-120 | head -90
