# Run 117: a quantized stage's copies addressed from two shared-window bases a thread (its piece of pass 0's
# rows, its scale row) plus constants, which ptxas folds into each copy's offset (run 116's SASS: ~160
# instructions a thread and chunk of int8 flat's staging, most of them its shared addresses recomputed).
# run 116's ab.py against main (main_cuda.py: kernels/cuda.py before this change), then the int8 warpgroup and
# cascade GPU tests (the producer's copies changed too) under NaN poisoning.
# main_cuda.py (main's kernels, not kept): `git show 45402b4:kernels/cuda.py > $D/main_cuda.py` here first.
# Device calls: carry .whl-b .whl-lm after a call that copied .whl-a into /tmp/w.
#   run.sh ab      -> ab/ and tests/
# Then run 102's `kv` mode on the branch, same machine (out-h100/kv):
#   bash docs/benchmark_results/h200-runs-2026-12-06/run102-h200-read/run.sh kv
# Ran on an H100 (out-h100/): ab (bit for bit; 38 tests passed), kv. No H200 came.
set -u
source benchmarks/device_env.sh || exit 1
D=docs/benchmark_results/h200-runs-2026-12-07/run117-copy-offsets
mkdir -p $OUT/ab $OUT/tests; cp $D/main_cuda.py kernels/cuda_main.py
MLXCEL_KERNELS=fused timeout 200 python3 docs/benchmark_results/h200-runs-2026-12-07/run116-scale-copies/ab.py \
  /tmp/ab > $OUT/ab/ab.log 2>&1
echo "ab exit $? at $SECONDS s"; cp /tmp/ab/* $OUT/ab/ 2>/dev/null; cat $OUT/ab/ab.md
tail -2 $OUT/ab/ab.log | cut -c1-300
MLXCEL_POISON_OUTPUTS=nan timeout 200 python3 -m pytest -q tests/test_fused_kernels.py \
  -k "int8 and (warpgroup or cascade)" > $OUT/tests/pytest.txt 2>&1
echo "tests exit $? at $SECONDS s"; tail -2 $OUT/tests/pytest.txt | cut -c1-300
