# Run 77: the kernel bench's KV-dtype arms (8192 x 32) on main as it stands (int8's stacked level: two
# warpgroups, the next chunk converted under O += P V, keys dequantized in the conversion).
# Device calls: carry .whl-b .whl-lm after a call that copied .whl-a into /tmp/w.
set -u
source benchmarks/device_env.sh || exit 1
MLXCEL_KERNELS=fused timeout 300 python3 benchmarks/gpu_attention_bench.py --out /tmp/att --kv-dtypes-only --reps 10 \
  --copy-mib 256 --matmul-n 4096 > $OUT/attention.log 2>&1
echo "attention exit $? at $SECONDS s"; cp /tmp/att/attention_bench.json /tmp/att/attention_bench.md $OUT/ 2>/dev/null
tail -16 $OUT/attention_bench.md 2>/dev/null
