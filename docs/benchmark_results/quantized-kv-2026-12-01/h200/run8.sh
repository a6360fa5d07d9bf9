# H200, part 8 (2026-12-05): int8 pages' stacked levels on the warpgroup kernel with Q staged over its own 16-bit
# pieces (aa7ff84): their GPU tests against float64, then the kernel bench's KV-dtype arms. Device call: carry
# .whl-b after a call that copied .whl-a and .whl-lm into /tmp/w. The probe runs only if the tests fail.
set -u
if ! PYTHONPATH=/tmp/site python3 -c "import mlx.core, mlx_lm" 2>/dev/null; then
  cp .whl-b/* /tmp/w/ && cat /tmp/w/part.* > /tmp/w/mlx_cuda_13-0.32.4-py3-none-manylinux_2_35_x86_64.whl && rm /tmp/w/part.*
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site /tmp/w/*.whl || exit 1
fi
mkdir -p /tmp/mlxcel-shim/mlxcel && ln -sfn $PWD/engine /tmp/mlxcel-shim/mlxcel/engine && ln -sfn $PWD/kernels /tmp/mlxcel-shim/mlxcel/kernels
export PYTHONPATH=/tmp/site:/tmp/mlxcel-shim:$PWD:$PWD/tests:$PWD/benchmarks PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
export MLX_PTX_CACHE_DIR=/tmp/ptx
echo "installed at $SECONDS s"
MLXCEL_KERNELS=fused MLXCEL_POISON_OUTPUTS=nan timeout 200 python3 -m pytest -q -p no:cacheprovider \
  tests/test_fused_kernels.py -k "(warpgroup and int8) or (three_launches and int8 and 64) or (partial_matches and None and 32 and (int8 or int4)) or (level0_on_warpgroup and 13 and not int8)" \
  --junitxml=$OUT/tests.xml > $OUT/tests.log 2>&1
rc=$?; echo "tests exit $rc at $SECONDS s"; tail -8 $OUT/tests.log
if [ $rc -ne 0 ]; then
  MLXCEL_KERNELS=fused timeout 90 python3 docs/benchmark_results/quantized-kv-2026-12-01/h200/part7-probe/probe.py 2>&1 | tail -8
  exit 1
fi
MLXCEL_KERNELS=fused timeout 180 python3 benchmarks/gpu_attention_bench.py --out /tmp/att --kv-dtypes-only --reps 10 \
  --copy-mib 256 --matmul-n 4096 > $OUT/attention.log 2>&1
echo "attention exit $? at $SECONDS s"; cp /tmp/att/attention_bench.json /tmp/att/attention_bench.md $OUT/ 2>/dev/null
tail -16 $OUT/attention_bench.md 2>/dev/null
