# Run 87 (diag.patch on main at 2255798's kernel, timing only): int8's stacked level with its producer converting
# K only, against main's. To rerun: apply diag.patch, save main's kernels/cuda_warpgroup.py beside probe.py as
# main_cuda_warpgroup.py. Output: out/probe.md (the K-only arm's outputs are wrong by design: nan).
set -u
source benchmarks/device_env.sh || exit 1
timeout 60 python3 docs/benchmark_results/h200-runs-2026-12-06/run87-producer-bound/probe.py /tmp/probe87 \
  > $OUT/probe.log 2>&1
echo "probe exit $? at $SECONDS s"; cp /tmp/probe87/probe.md $OUT/ 2>/dev/null; cat $OUT/probe.md
