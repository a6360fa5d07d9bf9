# Run 95: o's and down's decode products on producer_matmul with each tile's K split between two blocks
# (not kept: splitk.patch). The split and engine GPU tests first (the run stops if they fail), then the plain products
# (gpu_matmul_bench.py --rows 32 --producer: cuBLAS, the skinny kernel, producer_tiles' launch), then issue
# 18's cell end to end in one process: cascade with TMA (gate/up, o, down) and without (no-tma), flat, ABBA.
# Device call: carry .whl-b .whl-lm after a call that copied .whl-a into /tmp/w.
set -u
source benchmarks/device_env.sh || exit 1
MLXCEL_KERNELS=fused timeout 200 python3 -m pytest -q -x tests/test_cuda_matmul.py \
  -k "split_k or engines_o or engines_gate_up or producer or residual" > $OUT/gpu-test.log 2>&1
rc=$?; echo "tests exit $rc at $SECONDS s"; tail -3 $OUT/gpu-test.log; [ $rc = 0 ] || exit 1
timeout 150 python3 benchmarks/gpu_matmul_bench.py --out $OUT/matmul --rows 32 --producer > $OUT/matmul.log 2>&1
echo "matmul exit $? at $SECONDS s"; cat $OUT/matmul/matmul.md
timeout 330 python3 benchmarks/gpu_e2e_bench.py --out $OUT/e2e --cascade-matmuls auto,no-tma --skip-mlx-lm \
  > $OUT/e2e.log 2>&1
echo "e2e exit $? at $SECONDS s"; grep "^| " $OUT/e2e/e2e_bench.md
