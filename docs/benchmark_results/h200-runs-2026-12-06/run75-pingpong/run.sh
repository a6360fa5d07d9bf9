# Run 75 (main at 5f9d251 with pingpong.patch applied by `git apply`; not kept): the warpgroup kernel's GPU tests
# (bf16, f16, int8; blocks of one and two warpgroups) under NaN poisoning, then probe.py (main's kernel against
# the patched one, 8K and 32K x 32).
# Device calls: carry .whl-b .whl-lm after a call that copied .whl-a into /tmp/w.
set -u
source benchmarks/device_env.sh || exit 1
D=docs/benchmark_results/h200-runs-2026-12-06/run75-pingpong
MLXCEL_POISON_OUTPUTS=nan timeout 300 python3 -m pytest -q -x tests/test_fused_kernels.py -k "warpgroup" \
  > $OUT/tests.log 2>&1
echo "tests exit $? at $SECONDS s"; tail -3 $OUT/tests.log | cut -c1-300
timeout 240 python3 $D/probe.py /tmp/probe > $OUT/probe.log 2>&1
echo "probe exit $? at $SECONDS s"; cp /tmp/probe/* $OUT/ 2>/dev/null; cat $OUT/probe.md
tail -3 $OUT/probe.log | cut -c1-400
