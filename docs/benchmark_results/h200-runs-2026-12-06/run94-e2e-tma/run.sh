# Run 94 (not yet run: the next session's first read): main with gate/up's decode products on TMA, issue 18's
# cell (32 x 8K) in one e2e process: cascade with gate/up on TMA (auto) and without (MLXCEL_MATMUL=no-tma), flat,
# mlx-lm, ABBA. On an H200 where one starts (the targets are an H200's). Device call: carry .whl-b .whl-lm after
# a call that copied .whl-a into /tmp/w. Output: e2e-*/.
set -u
source benchmarks/device_env.sh || exit 1
out=$OUT/e2e-$(date +%s); mkdir -p $out
timeout 560 python3 benchmarks/gpu_e2e_bench.py --out /tmp/e2e --cascade-matmuls auto,no-tma > $out/e2e.log 2>&1
echo "e2e exit $? at $SECONDS s"; cp /tmp/e2e/e2e_bench.json /tmp/e2e/e2e_bench.md $out/ 2>/dev/null
grep "^| " $out/e2e_bench.md; grep -A3 '"cascade_vs_flat_tokens"\|"cascade_no-tma_vs_flat_tokens"' $out/e2e_bench.json
