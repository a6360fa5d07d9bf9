# Run 82: the kernel bench's KV-dtype arms (8192 x 32) on main with int8's producer warpgroup (run 80 merged it),
# read twice in one call on one machine.
# Device calls: carry .whl-b .whl-lm after a call that copied .whl-a into /tmp/w. Called twice on one warm
# H100 80GB HBM3: its out1/, out2/ are read1/, read2/ here, then read3/, read4/.
set -u
source benchmarks/device_env.sh || exit 1
for read in 1 2; do
  mkdir -p $OUT/out$read
  MLXCEL_KERNELS=fused timeout 250 python3 benchmarks/gpu_attention_bench.py --out /tmp/att$read --kv-dtypes-only \
    --reps 10 --copy-mib 256 --matmul-n 4096 > $OUT/out$read/attention.log 2>&1
  echo "attention $read exit $? at $SECONDS s"
  cp /tmp/att$read/attention_bench.json /tmp/att$read/attention_bench.md $OUT/out$read/ 2>/dev/null
  tail -16 $OUT/out$read/attention_bench.md 2>/dev/null
done
