# Main as it stands: the e2e bench (the verdict's read), probe.py (the step with MLX's buffer cache and
# without it: do the remaining stalls come from recycled buffers?), then ncu's full set over the four skinny
# launches (ncu_matmul.py: where their cycles go). Device call: carry .whl-b .whl-lm after a call that
# copied .whl-a into /tmp/w.
set -u
if ! PYTHONPATH=/tmp/site python3 -c "import mlx.core, mlx_lm" 2>/dev/null; then
  cp .whl-b/* /tmp/w/ && cat /tmp/w/part.* > /tmp/w/mlx_cuda_13-0.32.4-py3-none-manylinux_2_35_x86_64.whl && rm /tmp/w/part.*
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site /tmp/w/*.whl .whl-lm/*.whl || exit 1
fi
mkdir -p /tmp/mlxcel-shim/mlxcel && ln -sfn $PWD/engine /tmp/mlxcel-shim/mlxcel/engine && ln -sfn $PWD/kernels /tmp/mlxcel-shim/mlxcel/kernels
export PYTHONPATH=/tmp/site:/tmp/mlxcel-shim:$PWD:$PWD/tests:$PWD/benchmarks PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
export MLX_PTX_CACHE_DIR=/tmp/ptx
D=docs/benchmark_results/h200-runs-2026-12-03/run53-diagnose
echo "installed at $SECONDS s"
timeout 240 python3 benchmarks/gpu_e2e_bench.py --out /tmp/e2e > $OUT/e2e.log 2>&1
echo "e2e exit $? at $SECONDS s"; cp /tmp/e2e/e2e_bench.json /tmp/e2e/e2e_bench.md $OUT/ 2>/dev/null
grep "^| " $OUT/e2e_bench.md; grep -A2 '"cascade_vs_flat_tokens"\|"flat_vs_mlx_lm_tokens"' $OUT/e2e_bench.json | head -8
timeout 220 python3 $D/probe.py /tmp/probe > $OUT/probe.log 2>&1
echo "probe exit $? at $SECONDS s"; cp /tmp/probe/* $OUT/ 2>/dev/null; cat $OUT/probe.md; tail -2 $OUT/probe.log
timeout $((570 - SECONDS)) ncu --set full -k regex:skinny -c 8 -o /tmp/skinny python3 $D/ncu_matmul.py > $OUT/ncu.log 2>&1
echo "ncu exit $? at $SECONDS s"; tail -2 $OUT/ncu.log
ncu -i /tmp/skinny.ncu-rep --print-details all > $OUT/ncu_details.txt 2>&1
grep -E "skinny_matmul|Duration|DRAM Throughput|Registers Per|Achieved Occ|Warp Cycles Per Issued|Issued Warp|Stall Long|Stall Wait|Stall Barrier|Stall Short|No Eligible" \
  $OUT/ncu_details.txt | cut -c1-120 | head -60
