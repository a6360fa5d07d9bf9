# H200, part 5: after the portable kernels' int8 change (token scales on scores and weights, scales gathered a
# page at a time; the prefill gather reads through it too), the quantized tests and the decode-path suite again.
# Device call: carry .whl-b .whl-lm after a call that copied .whl-a into /tmp/w.
set -u
cp .whl-b/* /tmp/w/ && cat /tmp/w/part.* > /tmp/w/mlx_cuda_13-0.32.4-py3-none-manylinux_2_35_x86_64.whl && rm /tmp/w/part.*
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site /tmp/w/*.whl .whl-lm/*.whl || exit 1
mkdir -p /tmp/mlxcel-shim/mlxcel && ln -sfn $PWD/engine /tmp/mlxcel-shim/mlxcel/engine && ln -sfn $PWD/kernels /tmp/mlxcel-shim/mlxcel/kernels
export PYTHONPATH=/tmp/site:/tmp/mlxcel-shim:$PWD:$PWD/tests:$PWD/benchmarks PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
MLXCEL_KERNELS=fused MLXCEL_POISON_OUTPUTS=nan timeout 150 python3 -m pytest -q -p no:cacheprovider -rf \
  tests/test_quantized_kv.py tests/test_attention.py > $OUT/tests-fused.log 2>&1
echo "fused tests exit $? at $SECONDS s"; tail -1 $OUT/tests-fused.log
MLXCEL_KERNELS=portable timeout $((280 - SECONDS)) python3 -m pytest -q -p no:cacheprovider -rf \
  tests/test_quantized_kv.py > $OUT/tests-portable.log 2>&1
echo "portable tests exit $? at $SECONDS s"; tail -1 $OUT/tests-portable.log
