# Run 114: main (the CPU's whole traced layers; the GPU path as run 102 read it) on one warm machine: run 113's
# GPU tests, producer_matmul's wider blocks for gate/up (each x chunk staged once for more weight rows), then
# run 102's modes not yet read on an H200 (the step profile, issue 26's 32K cell).
# Device calls: carry .whl-b .whl-lm after a call that copied .whl-a into /tmp/w; each mode one call.
#   run.sh tests    run 113's tests -> tests/pytest.txt
#   run.sh sweep    gpu_matmul_bench.py at 32 rows, producer blocks of 64, 80, 96 and 128 columns -> sweep/
#   run.sh profile  run 102's step profile -> profile/
#   run.sh kv       run 102's 32 x 32K cell, bf16 and int8 pages -> kv/
#   run.sh e2e b    run 102's e2e cell without mlx-lm's arm -> e2e-b/
# Ran on an H100 (out-h100/): tests (3 failed: a trace test's bit-exactness of MLX's ops on a GPU, two CPU-only
# tests asserting the device; fixed in the tests), tests-2 after the fix (122 passed), sweep, e2e b.
# No H200 came: profile and kv not run.
set -u
case $1 in
tests) bash docs/benchmark_results/h200-runs-2026-12-07/run113-gpu-tests/run.sh tests ;;
sweep)
  source benchmarks/device_env.sh || exit 1
  out=$OUT/sweep; mkdir -p $out
  timeout 400 python3 benchmarks/gpu_matmul_bench.py --out /tmp/mm --rows 32 --producer --sweep \
    --sweep-tiles p8x4x12 p10x4x8 p12x4x8 p12x4x4 p16x4x4 > $out/matmul.log 2>&1
  echo "sweep exit $? at $SECONDS s"; cp /tmp/mm/* $out/ 2>/dev/null; cat $out/matmul.md; tail -3 $out/matmul.log ;;
profile|kv|e2e) bash docs/benchmark_results/h200-runs-2026-12-06/run102-h200-read/run.sh "$@" ;;
esac
