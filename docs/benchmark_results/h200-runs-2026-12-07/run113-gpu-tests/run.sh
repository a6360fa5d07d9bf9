# Run 113: the traced-layer and pool tests on a GPU after the CPU's whole traced layers (portable launches and
# K/V scatters inside a layer's trace, the CPU only; `whole` taking the rope tables and where K/V are stored).
# Device calls: carry .whl-b .whl-lm after a call that copied .whl-a into /tmp/w.
#   run.sh tests   tests/test_engine.py, test_cpu_layer_ops.py, test_layer_ops.py, test_pool.py,
#                  test_quantized_kv.py on the GPU -> tests/pytest.txt
set -u
source benchmarks/device_env.sh || exit 1
case $1 in
tests)
  out=$OUT/tests; mkdir -p $out
  python3 -c "import pytest" || exit 1
  timeout 500 python3 -m pytest -q -p no:cacheprovider -rfE tests/test_engine.py tests/test_cpu_layer_ops.py \
    tests/test_layer_ops.py tests/test_pool.py tests/test_quantized_kv.py > $out/pytest.txt 2>&1
  echo "tests exit $? at $SECONDS s"; tail -40 $out/pytest.txt ;;
esac
