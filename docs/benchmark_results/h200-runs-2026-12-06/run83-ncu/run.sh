# Run 83: Nsight Compute over the stacked level at 32768 shared x 32 (one layer), to see where a chunk's time
# goes: run 79's probe under ncu, whose first three warpgroup launches are its checks' calls in order: bf16
# (the kernel as on main), int8 without the producer (run 78's copy of main before it), int8 with the producer.
# Device calls: carry .whl-b .whl-lm after a call that copied .whl-a into /tmp/w. Output: ncu.txt, probe.md.
set -u
source benchmarks/device_env.sh || exit 1
timeout 400 ncu --clock-control none --kernel-name regex:warpgroup --launch-count 3 \
  --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
  --section SchedulerStats --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
  --section InstructionStats \
  python3 docs/benchmark_results/h200-runs-2026-12-06/run79-producer/probe.py /tmp/probe 32768x32 \
  > $OUT/ncu.txt 2>&1
echo "ncu exit $? at $SECONDS s"; cp /tmp/probe/probe.md $OUT/ 2>/dev/null
grep -E "Profiling|Duration|Issue Slots Busy|No Eligible|Active Warps Per Scheduler|Eligible Warps|Warp Cycles Per Issued|Stall|DRAM Throughput|Compute \(SM\)" $OUT/ncu.txt | head -80
