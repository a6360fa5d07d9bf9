# producer_matmul (warp-specialized: a copy warp, consumer warps splitting N, a shared ring handed over by
# mbarriers): its GPU tests against float64 (three processes; stop on a failure or a hang), the
# matmul bench at 32 rows (plain products: cuBLAS, main's launch, producer_tiles' and three other producer
# shapes), then probe.py (the engine's decode step on each kernel, A B B A in one process).
# Device call: carry .whl-b .whl-lm after a call that copied .whl-a into /tmp/w.
set -u
if ! PYTHONPATH=/tmp/site python3 -c "import mlx.core, mlx_lm" 2>/dev/null; then
  cp .whl-b/* /tmp/w/ && cat /tmp/w/part.* > /tmp/w/mlx_cuda_13-0.32.4-py3-none-manylinux_2_35_x86_64.whl && rm /tmp/w/part.*
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site /tmp/w/*.whl .whl-lm/*.whl || exit 1
fi
mkdir -p /tmp/mlxcel-shim/mlxcel && ln -sfn $PWD/engine /tmp/mlxcel-shim/mlxcel/engine && ln -sfn $PWD/kernels /tmp/mlxcel-shim/mlxcel/kernels
export PYTHONPATH=/tmp/site:/tmp/mlxcel-shim:$PWD:$PWD/tests:$PWD/benchmarks PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
export MLX_PTX_CACHE_DIR=/tmp/ptx
D=docs/benchmark_results/h200-runs-2026-12-05/run55-producer
echo "installed at $SECONDS s"
# Three processes (NVRTC compiles each kernel on its first launch, seconds each); -v names each test as it
# starts, so a hung launch (an mbarrier never completing) shows as its log's last line.
T="python3 -m pytest -v -p no:cacheprovider -rf tests/test_cuda_matmul.py"
timeout 90 $T -k "producer and bfloat16 and not compiles" > $OUT/tests_bf16.log 2>&1 & A=$!
timeout 90 $T -k "producer and float16 and not bfloat16 and not compiles" > $OUT/tests_f16.log 2>&1 & B=$!
timeout 90 $T -k "looping_producer" > $OUT/tests_loop.log 2>&1 & C=$!
wait $A; RA=$?; wait $B; RB=$?; wait $C; RC=$?
echo "tests exit $RA (bf16) $RB (f16) $RC (looping) at $SECONDS s"
LOGS="$OUT/tests_bf16.log $OUT/tests_f16.log $OUT/tests_loop.log"
for log in $LOGS; do grep -E "^FAILED|^ERROR|passed|failed|skipped" $log | tail -12; done
if [ $RA -ne 0 ] || [ $RB -ne 0 ] || [ $RC -ne 0 ]; then
  for log in $LOGS; do tail -3 $log | cut -c1-300; grep -E "^E " $log | head -12 | cut -c1-300; done
  exit 1
fi
timeout $((250 - SECONDS)) python3 benchmarks/gpu_matmul_bench.py --out /tmp/mm --rows 32 --producer --sweep \
  --sweep-tiles p8x4x8 p4x2x12 p4x4x24 > $OUT/matmul.log 2>&1
echo "bench exit $? at $SECONDS s"; cp /tmp/mm/matmul.* $OUT/ 2>/dev/null
grep '"arm"' $OUT/matmul.log | python3 -c "import sys,json; [print(r['shape'], r['arm'], round(r['gpu_us'],2), round(r['tb_s'],2), f\"{r['max_error']:.1e}\") for r in map(json.loads, sys.stdin)]"
grep -E "Error|error:" $OUT/matmul.log | head -3 | cut -c1-300
timeout $((415 - SECONDS)) python3 $D/probe.py /tmp/probe > $OUT/probe.log 2>&1
echo "probe exit $? at $SECONDS s"; cp /tmp/probe/* $OUT/ 2>/dev/null; cat $OUT/probe.md 2>/dev/null; tail -2 $OUT/probe.log | cut -c1-400
