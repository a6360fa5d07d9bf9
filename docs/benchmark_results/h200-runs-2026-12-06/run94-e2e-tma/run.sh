# Run 94: main with gate/up's decode products on TMA, issue 18's cell (32 x 8K) in one e2e process: cascade with
# gate/up on TMA (auto) and without (MLXCEL_MATMUL=no-tma), flat, ABBA, then the engine's gate/up GPU test.
# The device lent an H100: mlx-lm's batch of 32 8K prompts ran out of its 80 GB in the first read (e2e-a/), so
# this read skips it. Device call: carry .whl-b .whl-lm after a call that copied .whl-a into /tmp/w.
set -u
source benchmarks/device_env.sh || exit 1
out=$OUT/e2e-b; mkdir -p $out
timeout 420 python3 benchmarks/gpu_e2e_bench.py --out /tmp/e2e --cascade-matmuls auto,no-tma --skip-mlx-lm \
  > $out/e2e.log 2>&1
echo "e2e exit $? at $SECONDS s"; cp /tmp/e2e/e2e_bench.json /tmp/e2e/e2e_bench.md $out/ 2>/dev/null
grep "^| " $out/e2e_bench.md
MLXCEL_KERNELS=fused timeout 150 python3 -m pytest -q -x tests/test_cuda_matmul.py -k "engines_gate_up or producer" \
  > $OUT/gpu-test.log 2>&1; echo "tests exit $?"; tail -3 $OUT/gpu-test.log
