# Run 103 (not kept: settle.patch, the branch settle): a step enqueued only once its uploads' prefetches are
# done (managed.settle) against not waiting (probe.py, A B B A in one process a arm, tokens checked). Device calls:
# carry .whl-b .whl-lm after a call that copied .whl-a into /tmp/w. Output: out/.
set -u
source benchmarks/device_env.sh || exit 1
D=docs/benchmark_results/h200-runs-2026-12-06/run103-settle
timeout 60 python3 -m pytest -q -p no:cacheprovider tests/test_managed.py > $OUT/gpu-test.log 2>&1
echo "tests exit $?"; tail -2 $OUT/gpu-test.log
timeout 500 python3 $D/probe.py /tmp/probe > $OUT/probe.log 2>&1
echo "probe exit $? at $SECONDS s"; cp /tmp/probe/* $OUT/ 2>/dev/null; cat $OUT/probe.md 2>/dev/null
grep -v '^{' $OUT/probe.log | tail -4 | cut -c1-400
