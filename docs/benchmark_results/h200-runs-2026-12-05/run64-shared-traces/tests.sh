# Run 64, second call on the same machine: the GPU tests of the traced layers (whole-layer traces shared by the
# layers, bit-identical to the plain layers) and of the engine around them.
set -u
export PYTHONPATH=/tmp/site:/tmp/mlxcel-shim:$PWD:$PWD/tests:$PWD/benchmarks PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
export MLX_PTX_CACHE_DIR=/tmp/ptx
timeout 500 python3 -m pytest -q -p no:cacheprovider tests/test_engine.py tests/test_buffer_cache.py \
  > $OUT/tests.log 2>&1
echo "tests exit $? at $SECONDS s"; tail -15 $OUT/tests.log | cut -c1-400
