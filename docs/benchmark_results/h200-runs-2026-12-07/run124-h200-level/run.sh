# Run 124 (`tests` read on an H100 on 2026-12-08, out-h100/: 82 passed; the H200 modes not yet run): main after
# run 123's change to int8's stacked level (its conversion's stores on distinct banks; on an H100 the cascade step
# 1.03-1.06x at 32K), read on an H200, the card whose
# cascade int8 step at 32 x 32K missed cascade bf16's (run 121: 0.93x, 0.89x tok/s). Device calls: carry .whl-b
# .whl-lm after a call that copied .whl-a into /tmp/w; each mode one call, on one warm machine, in this order (the
# most needed first). An H100 gives nothing new (run 123 read the timings, this run's `tests` the GPU tests): pass
# kind nvidia-h200 and stop on an H100.
#   run.sh kv        issue 26's end-to-end cell (run 102's `kv` mode: 32 x 32K, bf16 and int8 pages; ~330 s) -> kv/
#   run.sh profile   run 122's step profile (both arms, both page formats, kernels by name and GPU ms a step; ~400 s):
#                    where the H200's int8 cascade step spends its extra time -> profile/
#   run.sh kernel    run 102's `kernel` mode (issue 26's kernel cell, 8192 shared x 32, two reads) -> kernel-N/
#   run.sh tests     the int8 fused-kernel and quantized-KV GPU tests under NaN poisoning (main's level stores
#                    went through run 123's bit-equality probe only; ~190 s on an H100) -> tests-int8/
set -u
source benchmarks/device_env.sh || exit 1
case $1 in
kv)
  bash docs/benchmark_results/h200-runs-2026-12-06/run102-h200-read/run.sh kv ;;
profile)
  bash docs/benchmark_results/h200-runs-2026-12-07/run122-h200-int8-32k/run.sh profile ;;
kernel)
  bash docs/benchmark_results/h200-runs-2026-12-06/run102-h200-read/run.sh kernel ;;
tests)
  mkdir -p $OUT/tests-int8
  MLXCEL_KERNELS=fused MLXCEL_POISON_OUTPUTS=nan timeout 300 python3 -m pytest -q tests/test_fused_kernels.py \
    tests/test_quantized_kv.py -k int8 > $OUT/tests-int8/pytest.txt 2>&1
  echo "tests exit $? at $SECONDS s"; tail -3 $OUT/tests-int8/pytest.txt | cut -c1-300 ;;
esac
