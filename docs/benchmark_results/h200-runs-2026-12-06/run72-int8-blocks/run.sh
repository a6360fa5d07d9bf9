# Run 72: int8 and bf16 level 0 on blocks of one or two warpgroups (probe.py), 8K and 32K x 32.
# Device call: carry .whl-b .whl-lm after a call that copied .whl-a into /tmp/w.
# Ran at commit e56669e, whose fused.WARPGROUPS_PER_BLOCK the probe sets (since: WARPGROUP_BLOCKS, with the ring).
set -u
source benchmarks/device_env.sh || exit 1
D=docs/benchmark_results/h200-runs-2026-12-06/run72-int8-blocks
timeout 400 python3 $D/probe.py /tmp/probe > $OUT/probe.log 2>&1
echo "probe exit $? at $SECONDS s"; cp /tmp/probe/* $OUT/ 2>/dev/null; cat $OUT/probe.md
tail -3 $OUT/probe.log | cut -c1-400
