# Run 85: run 83's Nsight Compute read again with the warps' stall reasons (the WarpStateStats section's raw
# metrics) and the stall sampling by instruction (SourceCounters), for the stacked level at 32768 x 32: bf16,
# int8 before the producer (run 78's copy of main then), int8 with it (main).
# Device calls: carry .whl-b .whl-lm after a call that copied .whl-a into /tmp/w. Output: ncu.txt, stalls.txt.
set -u
source benchmarks/device_env.sh || exit 1
timeout 400 ncu --clock-control none --kernel-name regex:warpgroup --launch-count 3 \
  --section WarpStateStats --section SourceCounters --page raw \
  python3 docs/benchmark_results/h200-runs-2026-12-06/run79-producer/probe.py /tmp/probe 32768x32 \
  > $OUT/ncu.txt 2>&1
echo "ncu exit $? at $SECONDS s"
grep -E "Profiling|custom_kernel.*Context|average_warps_issue_stalled_.*_per_issue_active|gpu__time_duration.sum" \
  $OUT/ncu.txt > $OUT/stalls.txt
grep -v "Profiling" $OUT/stalls.txt | awk '/Context/ {print substr($1, 1, 60); next} $NF+0 >= 0.1' | head -90
