# H200, part 4: after the int4 conversion rework (Marlin-style nibble masks), the fused-kernel GPU tests of the
# quantized pages and the kernel bench's KV-dtype arms again. Device call: carry .whl-b .whl-lm after .whl-a.
set -u
cp .whl-b/* /tmp/w/ && cat /tmp/w/part.* > /tmp/w/mlx_cuda_13-0.32.4-py3-none-manylinux_2_35_x86_64.whl && rm /tmp/w/part.*
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site /tmp/w/*.whl .whl-lm/*.whl || exit 1
mkdir -p /tmp/mlxcel-shim/mlxcel && ln -sfn $PWD/engine /tmp/mlxcel-shim/mlxcel/engine && ln -sfn $PWD/kernels /tmp/mlxcel-shim/mlxcel/kernels
export PYTHONPATH=/tmp/site:/tmp/mlxcel-shim:$PWD:$PWD/tests:$PWD/benchmarks PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
MLXCEL_KERNELS=fused timeout 150 python3 benchmarks/gpu_attention_bench.py --out /tmp/att --kv-dtypes-only --reps 10 \
  --copy-mib 256 --matmul-n 4096 > $OUT/attention.log 2>&1
echo "attention exit $? at $SECONDS s"; cp /tmp/att/attention_bench.json /tmp/att/attention_bench.md $OUT/ 2>/dev/null
tail -16 $OUT/attention_bench.md 2>/dev/null
MLXCEL_KERNELS=fused MLXCEL_POISON_OUTPUTS=nan timeout $((400 - SECONDS)) python3 -m pytest -q -p no:cacheprovider -rf \
  tests/test_fused_kernels.py -k "int4 or int8" > $OUT/tests.log 2>&1
echo "tests exit $? at $SECONDS s"; tail -3 $OUT/tests.log
