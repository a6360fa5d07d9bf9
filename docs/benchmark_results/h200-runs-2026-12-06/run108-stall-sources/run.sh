# Run 108: the decode step's stalls against what the host does meanwhile (probe.py: main, each step waited for
# before the next is built, no prefetch of host-written arrays). Device calls: carry .whl-b .whl-lm after a call
# that copied .whl-a into /tmp/w. Output: out/ (main as it stands); out-before-fix/ (main before middle prefill
# chunks' K/V were evaluated: its 8K prefix unwritten, so its tokens were not the model's).
set -u
source benchmarks/device_env.sh || exit 1
D=docs/benchmark_results/h200-runs-2026-12-06/run108-stall-sources
timeout 500 python3 $D/probe.py /tmp/probe > $OUT/probe.log 2>&1
echo "probe exit $? at $SECONDS s"; cp /tmp/probe/* $OUT/ 2>/dev/null; cat $OUT/probe.md 2>/dev/null
grep -v '^{' $OUT/probe.log | tail -4 | cut -c1-400
