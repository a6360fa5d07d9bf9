# Run 72, second call (the same warm machine): the 32 x 32K cell, bf16 and int8 pages, cascade and flat (ABBA in one
# process), int8's stacked level on the block size the probe timed faster (e2e_at_best.py). The warpgroup kernel's
# GPU tests passed with int8 pages on blocks of one and two warpgroups in quantized-kv part 8.
# Ran at commit e56669e (its fused.WARPGROUPS_PER_BLOCK; since: WARPGROUP_BLOCKS).
set -u
source benchmarks/device_env.sh || exit 1
D=docs/benchmark_results/h200-runs-2026-12-06/run72-int8-blocks
( while sleep 5; do nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits; done ) > $OUT/memory.log 2>&1 &
timeout 420 python3 $D/e2e_at_best.py /tmp/probe --out /tmp/e2e32 --shared 32768 --kv-dtypes bfloat16,int8 \
  --skip-mlx-lm > $OUT/e2e.log 2>&1
echo "e2e exit $? at $SECONDS s"
cp /tmp/e2e32/e2e_bench.json /tmp/e2e32/e2e_bench.md $OUT/; grep "^| " $OUT/e2e_bench.md
grep -A2 '"cascade_vs_flat_tokens"' $OUT/e2e_bench.json | head -4; tail -3 $OUT/e2e.log | cut -c1-300
