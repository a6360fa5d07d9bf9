# Run 98 (not kept: xtma.patch): producer_matmul's x rows through TMA too (a tensor map of x a launch, its
# address and rows put in by the copy warp with tensormap.replace), gate/up's launch. The producer GPU tests
# first (the run stops if they fail), the plain products (gpu_matmul_bench.py --rows 32 --producer), then issue
# 18's cell end to end in one process: cascade with TMA (auto) and without (no-tma), flat, ABBA.
# Device call: carry .whl-b .whl-lm after a call that copied .whl-a into /tmp/w.
set -u
source benchmarks/device_env.sh || exit 1
MLXCEL_KERNELS=fused timeout 110 python3 -m pytest -q -x tests/test_cuda_matmul.py \
  -k "(producer or engines_gate_up) and not compiles" > $OUT/gpu-test.log 2>&1
rc=$?; echo "tests exit $rc at $SECONDS s"; tail -3 $OUT/gpu-test.log | cut -c1-300; [ $rc = 0 ] || exit 1
timeout 40 python3 benchmarks/gpu_matmul_bench.py --out $OUT/matmul --rows 32 --producer > $OUT/matmul.log 2>&1
echo "matmul exit $? at $SECONDS s"; grep "gate_up\|producer" $OUT/matmul/matmul.md
timeout $((285 - SECONDS)) python3 benchmarks/gpu_e2e_bench.py --out $OUT/e2e --cascade-matmuls auto,no-tma \
  --skip-mlx-lm > $OUT/e2e.log 2>&1
echo "e2e exit $? at $SECONDS s"; grep "^cascade\|^flat" $OUT/e2e.log | cut -c1-200
grep -A2 '"cascade_vs_flat_tokens"' $OUT/e2e/e2e_bench.json
