# Run 84 (offset.patch on main at 2255798; not kept): the int8 warpgroup GPU tests of blocks of two
# warpgroups under NaN poisoning, then probe.py twice (main's kernel against the patched one, 8K and 32K x 32).
# The device time left no end-to-end read.
# Device calls: carry .whl-b .whl-lm after a call that copied .whl-a into /tmp/w. Output: out/. To rerun,
# apply offset.patch and save main's kernels/cuda_warpgroup.py beside probe.py as main_cuda_warpgroup.py.
set -u
source benchmarks/device_env.sh || exit 1
D=docs/benchmark_results/h200-runs-2026-12-06/run84-offset
MLXCEL_POISON_OUTPUTS=nan timeout 150 python3 -m pytest -q -x tests/test_fused_kernels.py \
  -k "int8-2- and warpgroup" > $OUT/tests.log 2>&1
echo "tests exit $? at $SECONDS s"; tail -3 $OUT/tests.log | cut -c1-300
for read in 1 2; do
  timeout 100 python3 $D/probe.py /tmp/probe$read > $OUT/probe$read.log 2>&1
  echo "probe $read exit $? at $SECONDS s"; cp /tmp/probe$read/probe.md $OUT/probe$read.md 2>/dev/null
  cat $OUT/probe$read.md; tail -2 $OUT/probe$read.log | cut -c1-600
done
