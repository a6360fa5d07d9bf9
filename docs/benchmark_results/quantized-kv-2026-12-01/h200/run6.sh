# H200, part 7 (2026-12-03): int8 pages' stacked levels on the warpgroup kernel (codes converted a chunk a block).
# Its GPU tests and the partial kernels' quantized tests (their staging now a shared header function), then the
# kernel bench's KV-dtype arms. Device call: carry .whl-b .whl-lm after a call that copied .whl-a into /tmp/w.
set -u
if ! PYTHONPATH=/tmp/site python3 -c "import mlx.core, mlx_lm" 2>/dev/null; then
  cp .whl-b/* /tmp/w/ && cat /tmp/w/part.* > /tmp/w/mlx_cuda_13-0.32.4-py3-none-manylinux_2_35_x86_64.whl && rm /tmp/w/part.*
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site /tmp/w/*.whl .whl-lm/*.whl || exit 1
fi
mkdir -p /tmp/mlxcel-shim/mlxcel && ln -sfn $PWD/engine /tmp/mlxcel-shim/mlxcel/engine && ln -sfn $PWD/kernels /tmp/mlxcel-shim/mlxcel/kernels
export PYTHONPATH=/tmp/site:/tmp/mlxcel-shim:$PWD:$PWD/tests:$PWD/benchmarks PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
export MLX_PTX_CACHE_DIR=/tmp/ptx
echo "installed at $SECONDS s"
MLXCEL_KERNELS=fused MLXCEL_POISON_OUTPUTS=nan timeout 240 python3 -m pytest -q -x -p no:cacheprovider \
  tests/test_fused_kernels.py -k "(warpgroup and int8) or (three_launches and int8 and 64) or (partial_matches and None and 32 and (int8 or int4)) or (level0_on_warpgroup and 13 and not int8)" \
  --junitxml=$OUT/tests.xml > $OUT/tests.log 2>&1
echo "tests exit $? at $SECONDS s"; tail -4 $OUT/tests.log
MLXCEL_KERNELS=fused timeout 200 python3 benchmarks/gpu_attention_bench.py --out /tmp/att --kv-dtypes-only --reps 10 \
  --copy-mib 256 --matmul-n 4096 > $OUT/attention.log 2>&1
echo "attention exit $? at $SECONDS s"; cp /tmp/att/attention_bench.json /tmp/att/attention_bench.md $OUT/ 2>/dev/null
tail -16 $OUT/attention_bench.md 2>/dev/null
