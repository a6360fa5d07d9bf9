# Run 122 (made, not yet run): why cascade int8's end-to-end step at 32 x 32K takes an H200 5-10% longer than
# cascade bf16's (run 121: 0.95x, 0.90x by the median step) where an H100's is 1-2% shorter. Device calls: carry
# .whl-b .whl-lm after a call that copied .whl-a into /tmp/w; each mode one call, on one warm machine (an H200).
#   run.sh profile   the step profile of both arms of both page formats at 32K (run 81's, there on an H100:
#                    kernels by name and GPU ms a step; ~400 s) -> profile/
#   run.sh kernel    the kernel bench's page formats at 32768 shared x 32 with 64 own tokens a row (near the e2e
#                    cell's rows), two reads: bf16 / int8 cascades side by side, the stacked level's share -> kernel-N/
#   run.sh e2e       issue 18's cell (run 102's `e2e a`) -> e2e-a/
set -u
source benchmarks/device_env.sh || exit 1
case $1 in
profile)
  mkdir -p $OUT/profile
  timeout 540 python3 benchmarks/gpu_step_profile.py --out /tmp/sp --shared 32768 --kv-dtypes bfloat16,int8 \
    > $OUT/profile/step_profile.log 2>&1
  echo "profile exit $? at $SECONDS s"; cp /tmp/sp/* $OUT/profile/ 2>/dev/null
  head -12 $OUT/profile/step_profile.md ;;
kernel)
  for n in 1 2; do
    out=$OUT/kernel-$n; mkdir -p $out
    MLXCEL_KERNELS=fused timeout 200 python3 benchmarks/gpu_attention_bench.py --out /tmp/att32k-$n --kv-dtypes-only \
      --kv-cell 32768x32 --tail 64 --reps 10 --copy-mib 256 --matmul-n 4096 > $out/att.log 2>&1
    echo "kernel $n exit $? at $SECONDS s"
    cp /tmp/att32k-$n/attention_bench.json /tmp/att32k-$n/attention_bench.md $out/ 2>/dev/null
    grep -E "^\| (bf16|int8|int4)" $out/attention_bench.md
  done ;;
e2e)
  bash docs/benchmark_results/h200-runs-2026-12-06/run102-h200-read/run.sh e2e a ;;
esac
