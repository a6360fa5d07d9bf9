# Run 96 (not kept: ../run95-split-k/splitk.patch): the engine's cascade step with o and down split-K on
# producer_matmul against the same step with them on the skinny kernel (probe.py, A B B A in one process,
# tokens checked). Device calls: carry .whl-b .whl-lm after a call that copied .whl-a into /tmp/w. Output: out/.
set -u
source benchmarks/device_env.sh || exit 1
D=docs/benchmark_results/h200-runs-2026-12-06/run96-split-engine
timeout 400 python3 $D/probe.py /tmp/probe > $OUT/probe.log 2>&1
echo "probe exit $? at $SECONDS s"; cp /tmp/probe/* $OUT/ 2>/dev/null; cat $OUT/probe.md 2>/dev/null
grep -v '^{' $OUT/probe.log | tail -4 | cut -c1-400
