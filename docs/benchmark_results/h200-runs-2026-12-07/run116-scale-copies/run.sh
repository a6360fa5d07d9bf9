# Run 116: a quantized stage's scale copies under a predicate (every thread issues each scale array's copy, no
# branch a pass; run 115's SASS had int8 flat's staging at ~200 instructions a thread and chunk against bf16's
# ~95). ab.py: main's flat partial kernels beside the branch's, bit for bit, timed side by side.
# main_cuda.py (main's kernels, not kept): `git show 94d7648:kernels/cuda.py > $D/main_cuda.py` here first.
# Device calls: carry .whl-b .whl-lm after a call that copied .whl-a into /tmp/w; each mode one call.
#   run.sh ab      ab.py at 8192 x 32 and 32768 x 32 -> ab/
#   run.sh tests   the int8 and int4 fused-kernel and quantized-KV GPU tests under NaN poisoning -> tests/
# Then run 102's `kv` and `kernel` modes on the branch, same machine (out-h100/kv, kernel-1, kernel-2):
#   bash docs/benchmark_results/h200-runs-2026-12-06/run102-h200-read/run.sh kv   (and: ... kernel)
# Ran on an H100 (out-h100/): ab, tests (161 passed), kv, kernel. No H200 came.
set -u
source benchmarks/device_env.sh || exit 1
D=docs/benchmark_results/h200-runs-2026-12-07/run116-scale-copies
case $1 in
ab)
  mkdir -p $OUT/ab; cp $D/main_cuda.py kernels/cuda_main.py
  MLXCEL_KERNELS=fused timeout 400 python3 $D/ab.py /tmp/ab > $OUT/ab/ab.log 2>&1
  echo "ab exit $? at $SECONDS s"; cp /tmp/ab/* $OUT/ab/ 2>/dev/null; cat $OUT/ab/ab.md
  tail -3 $OUT/ab/ab.log | cut -c1-400 ;;
tests)
  mkdir -p $OUT/tests
  MLXCEL_POISON_OUTPUTS=nan timeout 500 python3 -m pytest -q tests/test_fused_kernels.py tests/test_quantized_kv.py \
    -k "int8 or int4 or quantized" > $OUT/tests/pytest.txt 2>&1
  echo "tests exit $? at $SECONDS s"; tail -5 $OUT/tests/pytest.txt | cut -c1-300 ;;
esac
