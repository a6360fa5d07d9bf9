# Run 94 (not yet run: the next session's first read): main with gate/up's decode products on TMA, issue 18's
# cell (32 x 8K: cascade, flat ABBA, mlx-lm) in one e2e process; with `tma-off`, the same with the TMA switch off
# (cuda_matmul.TMA) for an A/B on one warm machine. On an H200 where one starts (the targets are an H200's).
# Device call: carry .whl-b .whl-lm after a call that copied .whl-a into /tmp/w. Output: e2e-*/.
set -u
source benchmarks/device_env.sh || exit 1
out=$OUT/e2e-${1:-tma}-$(date +%s); mkdir -p $out
if [ "${1:-tma}" = tma-off ]; then
  export PYTHONPATH=$PWD/docs/benchmark_results/h200-runs-2026-12-06/run94-e2e-tma:$PYTHONPATH   # sitecustomize
fi
timeout 480 python3 benchmarks/gpu_e2e_bench.py --out /tmp/e2e > $out/e2e.log 2>&1
echo "e2e exit $? at $SECONDS s"; cp /tmp/e2e/e2e_bench.json /tmp/e2e/e2e_bench.md $out/ 2>/dev/null
grep "^| " $out/e2e_bench.md; grep -A3 '"cascade_vs_flat_tokens"\|"flat_vs_mlx_lm_tokens"' $out/e2e_bench.json | head -12
