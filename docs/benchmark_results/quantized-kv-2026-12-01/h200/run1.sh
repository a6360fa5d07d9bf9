# H200, part 1 of the quantized-KV run: install, the GPU tests of the fused kernels on int8/int4 pages, the q/k/v
# kernel's quantized store, the quantized engine paths, then the kernel bench's KV-dtype arms (8192 shared x 32).
# Device call: carry .whl-b .whl-lm after a call that copied .whl-a into /tmp/w.
set -u
cp .whl-b/* /tmp/w/ && cat /tmp/w/part.* > /tmp/w/mlx_cuda_13-0.32.4-py3-none-manylinux_2_35_x86_64.whl && rm /tmp/w/part.*
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site /tmp/w/*.whl .whl-lm/*.whl || exit 1
mkdir -p /tmp/mlxcel-shim/mlxcel && ln -sfn $PWD/engine /tmp/mlxcel-shim/mlxcel/engine && ln -sfn $PWD/kernels /tmp/mlxcel-shim/mlxcel/kernels
export PYTHONPATH=/tmp/site:/tmp/mlxcel-shim:$PWD:$PWD/tests:$PWD/benchmarks PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
echo "installed at $SECONDS s"
MLXCEL_KERNELS=fused MLXCEL_POISON_OUTPUTS=nan timeout ${TESTS_S:-540} python3 -m pytest -q -p no:cacheprovider -rf \
  tests/test_quantized_kv.py tests/test_layer_ops.py tests/test_layer_ops_sources.py tests/test_fused_kernels.py \
  ${MORE_TESTS:-} > $OUT/tests.log 2>&1
echo "tests exit $? at $SECONDS s"; grep -E "^FAILED|^ERROR|passed|failed" $OUT/tests.log | tail -12
[ "${BENCH:-1}" = 1 ] || exit 0
MLXCEL_KERNELS=fused timeout $((585 - SECONDS)) python3 benchmarks/gpu_attention_bench.py --out /tmp/att \
  --kv-dtypes-only --reps 10 --copy-mib 256 --matmul-n 4096 > $OUT/attention.log 2>&1
echo "attention exit $? at $SECONDS s"; cp /tmp/att/attention_bench.json /tmp/att/attention_bench.md $OUT/ 2>/dev/null
head -40 $OUT/attention_bench.md 2>/dev/null; tail -5 $OUT/attention.log
