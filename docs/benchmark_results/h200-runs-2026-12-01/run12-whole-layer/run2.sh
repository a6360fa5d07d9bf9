# The same warm machine: the GPU tests of the decode path (fused kernels, outputs poisoned with NaN).
export PYTHONPATH=/tmp/site:/tmp/mlxcel-shim:$PWD:$PWD/tests:$PWD/benchmarks PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
export MLX_PTX_CACHE_DIR=/tmp/ptx
MLXCEL_KERNELS=fused MLXCEL_POISON_OUTPUTS=nan timeout 560 python3 -m pytest -q -p no:cacheprovider -rf \
  tests/test_engine.py tests/test_attention.py tests/test_cascade_fault.py tests/test_layer_ops.py > $OUT/tests.log 2>&1
echo "tests exit $? at $SECONDS s"; grep -E "^FAILED|^ERROR|passed|failed" $OUT/tests.log | tail -12
