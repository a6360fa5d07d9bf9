# Run 104: the flat launch's tile width across four cells (probe.py: bf16 and int8 pages, the heuristic's width
# and 64 / 128 / 256 / 1000 pages, timed side by side a cell). Device calls: carry .whl-b .whl-lm after a call that
# copied .whl-a into /tmp/w. Output: out/.
set -u
source benchmarks/device_env.sh || exit 1
D=docs/benchmark_results/h200-runs-2026-12-06/run104-flat-widths
MLXCEL_KERNELS=fused timeout 250 python3 $D/probe.py /tmp/probe > $OUT/probe.log 2>&1
echo "probe exit $? at $SECONDS s"; cp /tmp/probe/* $OUT/ 2>/dev/null; cat $OUT/probe.md
tail -3 $OUT/probe.log | cut -c1-400
# Then, on the same warm machine: the other three cells (16384 x 32, 8192 x 8, 4096 x 128) -> out/probe2.*:
#   source benchmarks/device_env.sh && MLXCEL_KERNELS=fused python3 $D/probe.py /tmp/probe2 16384x32 8192x8 4096x128
