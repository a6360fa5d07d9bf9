# Run 111 (ran on an H100, 2026-12-07: out/): whether MLX's memory limit sets the ~80 GB peak of run
# 110's cell (5,000-page pool): probe.py, the default limit against 50 GB in one process. Device calls: carry
# .whl-b .whl-lm after a call that copied .whl-a into /tmp/w (or on a warm machine with both installed). Output: $OUT.
set -u
source benchmarks/device_env.sh || exit 1
timeout 420 python3 docs/benchmark_results/h200-runs-2026-12-06/run111-memory-limit/probe.py /tmp/p111 \
  > $OUT/probe.log 2>&1
echo "probe exit $? at $SECONDS s"; cp /tmp/p111/probe.json $OUT/ 2>/dev/null; grep '^{' $OUT/probe.log
