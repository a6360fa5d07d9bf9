# Run 118: int8 flat's instructions a chunk (SASS of the loop, nvdisasm here: 683 -> 632): a quantized stage's
# copies from a page and pass base (64-bit arithmetic a page and pass, not a copy); int8 values' scales carried by
# the weights (a score takes its value scale's log2, the row sums count the weights without), so value codes go
# to the mma unscaled; the scores' key codes biased by 1152 (no subtraction), each row's bias taken away with
# the key's scale. ab.py: main's flat partial kernels beside the branch's, timed side by side.
# main_cuda.py (main's kernels, not kept): `git show eea54cc:kernels/cuda.py > $D/main_cuda.py` here first.
# Device calls: carry .whl-b .whl-lm after a call that copied .whl-a into /tmp/w.
#   run.sh check   the int8 and int4 fused-kernel and quantized-KV GPU tests under NaN poisoning -> tests/,
#                  then ab.py at 8192 x 32 and 32768 x 32 -> ab/
# Then run 102's `kernel` and `kv` modes on the branch, same machine:
#   bash docs/benchmark_results/h200-runs-2026-12-06/run102-h200-read/run.sh kernel   (and: ... kv)
set -u
source benchmarks/device_env.sh || exit 1
D=docs/benchmark_results/h200-runs-2026-12-07/run118-conversions
mkdir -p $OUT/tests $OUT/ab
MLXCEL_POISON_OUTPUTS=nan timeout 330 python3 -m pytest -q -x tests/test_fused_kernels.py tests/test_quantized_kv.py \
  -k "int8 or int4 or quantized" > $OUT/tests/pytest.txt 2>&1
echo "tests exit $? at $SECONDS s"; tail -5 $OUT/tests/pytest.txt | cut -c1-300
cp $D/main_cuda.py kernels/cuda_main.py
MLXCEL_KERNELS=fused timeout 200 python3 $D/ab.py /tmp/ab > $OUT/ab/ab.log 2>&1
echo "ab exit $? at $SECONDS s"; cp /tmp/ab/* $OUT/ab/ 2>/dev/null; cat $OUT/ab/ab.md
grep "int8:" $OUT/ab/ab.log; tail -3 $OUT/ab/ab.log | cut -c1-400
