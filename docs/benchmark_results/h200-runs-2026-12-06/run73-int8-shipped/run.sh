# Run 73: the 32 x 32K cell (bf16 and int8 pages, cascade and flat, ABBA in one process) with int8's stacked level
# as shipped (fused.WARPGROUP_BLOCKS: two warpgroups a block, a ring of three chunks).
# Device call: carry .whl-b .whl-lm after a call that copied .whl-a into /tmp/w.
set -u
source benchmarks/device_env.sh || exit 1
( while sleep 5; do nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits; done ) > $OUT/memory.log 2>&1 &
timeout 420 python3 benchmarks/gpu_e2e_bench.py --out /tmp/e2e32 --shared 32768 --kv-dtypes bfloat16,int8 \
  --skip-mlx-lm > $OUT/e2e.log 2>&1
echo "e2e exit $? at $SECONDS s"
cp /tmp/e2e32/e2e_bench.json /tmp/e2e32/e2e_bench.md $OUT/; grep "^| " $OUT/e2e_bench.md
grep -A2 '"cascade_vs_flat_tokens"' $OUT/e2e_bench.json | head -4; tail -3 $OUT/e2e.log | cut -c1-300
