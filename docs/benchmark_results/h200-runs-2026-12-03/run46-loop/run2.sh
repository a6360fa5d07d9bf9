# Main with the looping gate/up launch: the e2e bench (cascade, flat ABBA, mlx-lm), then the step profile.
# Device call: on the machine run.sh installed.
set -u
export PYTHONPATH=/tmp/site:/tmp/mlxcel-shim:$PWD:$PWD/tests:$PWD/benchmarks PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
export MLX_PTX_CACHE_DIR=/tmp/ptx
timeout 250 python3 benchmarks/gpu_e2e_bench.py --out /tmp/e2e > $OUT/e2e.log 2>&1
echo "e2e exit $? at $SECONDS s"; cp /tmp/e2e/e2e_bench.json /tmp/e2e/e2e_bench.md $OUT/ 2>/dev/null
grep "^| " $OUT/e2e_bench.md; grep -A3 '"cascade_vs_flat_tokens"\|"flat_vs_mlx_lm_tokens"' $OUT/e2e_bench.json | head -12
timeout $((560 - SECONDS)) python3 benchmarks/gpu_step_profile.py --out /tmp/sp > $OUT/step_profile.log 2>&1
echo "profile exit $? at $SECONDS s"; cp /tmp/sp/* $OUT/ 2>/dev/null; ls $OUT; grep -B2 -A30 "cascade, kernels" $OUT/step_profile.md | cut -c1-200 | head -45
