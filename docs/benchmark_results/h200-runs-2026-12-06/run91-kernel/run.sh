# Run 91 (main after the producers2 merge): the kernel bench's KV-dtype arms, three reads on one warm machine
# (run 82's command; run 88 read the branch once). Device calls: carry .whl-b .whl-lm after a call that copied
# .whl-a into /tmp/w. Output: read1/ .. read3/.
set -u
source benchmarks/device_env.sh || exit 1
for read in 1 2 3; do
  MLXCEL_KERNELS=fused timeout 100 python3 benchmarks/gpu_attention_bench.py --out /tmp/att$read --kv-dtypes-only \
    --reps 10 --copy-mib 256 --matmul-n 4096 > /tmp/att$read.log 2>&1
  echo "read $read exit $? at $SECONDS s"; mkdir -p $OUT/read$read
  cp /tmp/att$read.log /tmp/att$read/attention_bench.json /tmp/att$read/attention_bench.md $OUT/read$read/ 2>/dev/null
  grep -E "^\| (bf16|int8|int4)|^\| int" $OUT/read$read/attention_bench.md
done
