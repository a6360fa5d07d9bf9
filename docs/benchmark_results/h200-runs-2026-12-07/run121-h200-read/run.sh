# Run 121 (made, not yet run): main as it stands read on an H200 for both issues' verdicts (no H200 has come since
# run 102). Device calls: carry .whl-b .whl-lm after a call that copied .whl-a into /tmp/w; each mode one call, on
# one warm machine, in this order.
#   run.sh read    the int8 and int4 fused-kernel and quantized-KV GPU tests under NaN poisoning, a pytest a dtype
#                  (on an H100: ~190 s and ~125 s) -> tests-int8/, tests-int4/; then run 102's `kernel` mode (issue
#                  26's kernel cell, 8192 shared x 32, bf16 / int8 / int4, flat and cascade, two reads) -> kernel-N/
#   run.sh kv      issue 26's end-to-end cell (run 102's `kv` mode: 32 x 32K, bf16 and int8 pages; ~300 s) -> kv/
#   run.sh e2e     issue 18's cell (run 102's `e2e a` mode: 32 x 8K, cascade and flat ABBA, mlx-lm's arm on an
#                  H200) -> e2e-a/
#   run.sh kbias   kbias.patch (made here, compiled with nvcc: int8's transposed kernel with its key codes biased
#                  by 1152, no HSUB2 a code pair, each head's 1152 x sum of q taken off its scores' chains; its
#                  loop 585 -> 529 instructions, 96 registers: still five blocks an SM) against this code, int8
#                  flat partial launch side by side (run 118's variants.py) -> kbias/; then, the patch applied,
#                  the int8 GPU tests -> kbias-tests/
set -u
source benchmarks/device_env.sh || exit 1
case $1 in
read)
  for dtype in int8 int4; do
    mkdir -p $OUT/tests-$dtype
    MLXCEL_POISON_OUTPUTS=nan timeout 240 python3 -m pytest -q -x tests/test_fused_kernels.py \
      tests/test_quantized_kv.py -k $dtype > $OUT/tests-$dtype/pytest.txt 2>&1
    echo "tests $dtype exit $? at $SECONDS s"; tail -1 $OUT/tests-$dtype/pytest.txt | cut -c1-300
  done
  bash docs/benchmark_results/h200-runs-2026-12-06/run102-h200-read/run.sh kernel ;;
kv)
  bash docs/benchmark_results/h200-runs-2026-12-06/run102-h200-read/run.sh kv ;;
e2e)
  bash docs/benchmark_results/h200-runs-2026-12-06/run102-h200-read/run.sh e2e a ;;
kbias)
  D=docs/benchmark_results/h200-runs-2026-12-07/run121-h200-read
  mkdir -p $OUT/kbias $OUT/kbias-tests; cp kernels/cuda.py kernels/cuda_main.py
  patch -s -o kernels/cuda_kbias.py kernels/cuda.py $D/kbias.patch || exit 1
  MLXCEL_KERNELS=fused timeout 200 python3 docs/benchmark_results/h200-runs-2026-12-07/run118-conversions/variants.py \
    /tmp/kbias kbias=cuda_kbias > $OUT/kbias/variants.log 2>&1
  echo "kbias exit $? at $SECONDS s"; cp /tmp/kbias/* $OUT/kbias/ 2>/dev/null; cat $OUT/kbias/variants.md
  grep "difference" $OUT/kbias/variants.log; mv kernels/cuda_kbias.py kernels/cuda.py; rm kernels/cuda_main.py
  MLXCEL_POISON_OUTPUTS=nan timeout 280 python3 -m pytest -q -x tests/test_fused_kernels.py \
    tests/test_quantized_kv.py -k int8 > $OUT/kbias-tests/pytest.txt 2>&1
  echo "tests exit $? at $SECONDS s"; tail -1 $OUT/kbias-tests/pytest.txt | cut -c1-300 ;;
esac
