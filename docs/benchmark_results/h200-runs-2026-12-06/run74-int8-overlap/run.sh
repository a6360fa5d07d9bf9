# Run 74 (branch int8-overlap): its int8 warpgroup GPU tests, then probe.py (main's kernel against the branch's,
# 8K and 32K x 32). The 32 x 32K end-to-end cell: run 73's script, on the same machine.
# Device calls: carry .whl-b .whl-lm after a call that copied .whl-a into /tmp/w.
set -u
source benchmarks/device_env.sh || exit 1
D=docs/benchmark_results/h200-runs-2026-12-06/run74-int8-overlap
MLXCEL_POISON_OUTPUTS=nan timeout 240 python3 -m pytest -q -x tests/test_fused_kernels.py -k "int8" \
  > $OUT/tests.log 2>&1
echo "tests exit $? at $SECONDS s"; tail -3 $OUT/tests.log | cut -c1-300
timeout 240 python3 $D/probe.py /tmp/probe > $OUT/probe.log 2>&1
echo "probe exit $? at $SECONDS s"; cp /tmp/probe/* $OUT/ 2>/dev/null; cat $OUT/probe.md
tail -3 $OUT/probe.log | cut -c1-400
