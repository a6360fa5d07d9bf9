# Run 80 (git branch producer, merged after it): the reads that decided int8's producer warpgroup merges.
# `run.sh kernel`: the int8 fused-kernel GPU tests under NaN poisoning, then run 79's probe twice (main's kernel
# against the branch's, 8K and 32K x 32). `run.sh e2e`, twice on the same warm machine: the 32 x 32K cell (bf16
# and int8 pages, cascade and flat, ABBA in one process). Merge if both e2e reads put cascade int8 / cascade bf16
# at or above main's 0.94-0.95x (run 74) and the probes agree with run 79.
# Device calls: carry .whl-b .whl-lm after a call that copied .whl-a into /tmp/w. Output: kernel/ (tests.log,
# probe1.md, probe2.md), e2e-1/ and e2e-2/ (the two e2e reads), all on one warm H100 80GB HBM3.
set -u
source benchmarks/device_env.sh || exit 1
if [ "$1" = kernel ]; then
  MLXCEL_POISON_OUTPUTS=nan timeout 240 python3 -m pytest -q -x tests/test_fused_kernels.py -k "int8" \
    > $OUT/tests.log 2>&1
  echo "tests exit $? at $SECONDS s"; tail -3 $OUT/tests.log | cut -c1-300
  for read in 1 2; do
    timeout 120 python3 docs/benchmark_results/h200-runs-2026-12-06/run79-producer/probe.py /tmp/probe$read \
      > $OUT/probe$read.log 2>&1
    echo "probe $read exit $? at $SECONDS s"; cp /tmp/probe$read/probe.md $OUT/probe$read.md; cat $OUT/probe$read.md
  done
else
  out=$OUT/e2e-$(date +%s); mkdir -p $out
  timeout 400 python3 benchmarks/gpu_e2e_bench.py --out /tmp/e2e32 --shared 32768 --kv-dtypes bfloat16,int8 \
    --skip-mlx-lm > $out/e2e.log 2>&1
  echo "e2e exit $? at $SECONDS s"
  cp /tmp/e2e32/e2e_bench.json /tmp/e2e32/e2e_bench.md $out/; grep "^| " $out/e2e_bench.md
fi
