# Run 115: the flat launch's staging ring (probe.py: bf16, int8 and int4 pages on rings of 2, 3 and 4 chunks),
# and Nsight Compute over the three ring-of-2 flat kernels at 8192 x 32 (registers, occupancy, issue, stalls).
# Device calls: carry .whl-b .whl-lm after a call that copied .whl-a into /tmp/w; each mode one call.
#   run.sh probe   -> probe/
#   run.sh ncu     -> ncu/ncu.txt
#   run.sh bounds  bounds.py: the flat kernels under __launch_bounds__(128, 4 or 5) -> bounds/
#   run.sh widths  widths.py: the heuristic's tile width against 6 even tiles a row -> widths/
#   run.sh sass    the ring-of-2 flat kernels' SASS, executed instructions a line (ncu) -> sass/
#   run.sh ncu-b   Nsight Compute over bounds.py's kernels of 4 blocks an SM -> ncu-b/ncu.txt
set -u
source benchmarks/device_env.sh || exit 1
D=docs/benchmark_results/h200-runs-2026-12-07/run115-flat-stages
case $1 in
probe)
  mkdir -p $OUT/probe
  MLXCEL_KERNELS=fused timeout 400 python3 $D/probe.py /tmp/probe > $OUT/probe/probe.log 2>&1
  echo "probe exit $? at $SECONDS s"; cp /tmp/probe/* $OUT/probe/ 2>/dev/null; cat $OUT/probe/probe.md
  tail -3 $OUT/probe/probe.log | cut -c1-400 ;;
ncu|ncu-b)
  mkdir -p $OUT/$1
  if [ $1 = ncu ]; then args="regex:quantized_partial|mlxcel_partial --launch-count 4 $D/probe.py"
  else args="regex:_b4 --launch-count 3 $D/bounds.py"; fi
  set -- $1 $args
  MLXCEL_KERNELS=fused timeout 400 ncu --clock-control none --kernel-name $2 --launch-count $4 --section SpeedOfLight \
    --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats \
    --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section InstructionStats \
    python3 $5 /tmp/ncu --once 8192x32 > $OUT/$1/ncu.txt 2>&1
  echo "ncu exit $? at $SECONDS s"
  grep -E "mlxcel_|Duration|Registers Per|Achieved Occ|Theoretical Occ|Block Limit|Issue Slots Busy|No Eligible|\
Active Warps Per Scheduler|Eligible Warps|Warp Cycles Per Issued|Executed Instructions  |DRAM Throughput|\
Compute \(SM\)|L2 Hit|Stall|Local" $OUT/$1/ncu.txt | cut -c1-160 | head -120 ;;
bounds)
  mkdir -p $OUT/bounds
  MLXCEL_KERNELS=fused timeout 400 python3 $D/bounds.py /tmp/bounds > $OUT/bounds/bounds.log 2>&1
  echo "bounds exit $? at $SECONDS s"; cp /tmp/bounds/* $OUT/bounds/ 2>/dev/null; cat $OUT/bounds/bounds.md
  tail -5 $OUT/bounds/bounds.log | cut -c1-600 ;;
widths)
  mkdir -p $OUT/widths
  MLXCEL_KERNELS=fused timeout 400 python3 $D/widths.py /tmp/widths 8192x32 32768x32 2048x32 8192x64 \
    > $OUT/widths/widths.log 2>&1
  echo "widths exit $? at $SECONDS s"; cp /tmp/widths/* $OUT/widths/ 2>/dev/null; cat $OUT/widths/widths.md
  tail -5 $OUT/widths/widths.log | cut -c1-600 ;;
sass)
  # Each ring-of-2 flat kernel's SASS with executed instructions a line (Nsight Compute's source page).
  mkdir -p $OUT/sass
  MLXCEL_KERNELS=fused timeout 300 ncu --clock-control none --kernel-name regex:quantized_partial\|mlxcel_partial \
    --launch-skip 1 --launch-count 3 --section SourceCounters -o /tmp/rep -f \
    python3 $D/probe.py /tmp/sass --once 8192x32 > $OUT/sass/ncu.log 2>&1
  echo "ncu exit $? at $SECONDS s"; tail -3 $OUT/sass/ncu.log
  ncu --import /tmp/rep.ncu-rep --page source --print-source sass --csv > $OUT/sass/sass.csv 2> $OUT/sass/import.log
  echo "import exit $?"; wc -l $OUT/sass/sass.csv; head -c 600 $OUT/sass/sass.csv ;;
esac
