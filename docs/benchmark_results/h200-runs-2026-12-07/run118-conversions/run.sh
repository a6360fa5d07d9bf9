# Run 118: int8 flat's instructions a chunk (its loop's SASS read here with nvdisasm: 683 -> 632) against its time.
# Three changes, each a patch on main's kernels/cuda.py (eea54cc): copies.patch (a quantized stage's copies from a
# page and pass base: 64-bit arithmetic a page and pass, not a copy), vscale.patch (+ int8 values' scales carried
# by the weights: a score takes its value scale's log2, the row sums count the weights without it, so value codes
# reach the mma unscaled), kbias.patch (copies + the scores' key codes biased by 1152, each row's bias taken away
# with the key's scale); the branch (bd59d6e) had all three. after_scores.patch, after_softmax.patch: main with a
# chunk's refill issued after step 0's scores or softmax instead of before the step; chains.patch: main with the
# int8 scores' k-steps summed in two mma chains (even and odd), not one. None kept: every arm read was slower.
# Made here first (not kept): git show eea54cc:kernels/cuda.py > $D/main_cuda.py, then for each patch P
#   patch -s -o $D/P_cuda.py $D/main_cuda.py $D/P.patch
# Device calls: carry .whl-b .whl-lm after a call that copied .whl-a into /tmp/w.
#   run.sh check     (on the branch) the int8 and int4 fused-kernel and quantized-KV GPU tests under NaN
#                    poisoning -> tests/, then ab.py at 8192 x 32 and 32768 x 32 -> ab/
#   run.sh variants  (on the branch) variants.py: main, each change, the branch, and main and the branch on
#                    chunks of 128 tokens, int8 flat side by side -> variants/
#   run.sh refill    variants.py: main against after_scores, after_softmax and chains -> refill/
#   run.sh sass      run 115's `sass` mode on main (main_cuda.py over kernels/cuda.py) -> sass/, kept as sass-main/
#                    (regions.py there: the loop's samples and instructions by region -> sass-main/regions.txt)
# Ran on an H100 (out-h100/): check (161 passed), variants, sass. Not run: refill (made; no machine came). No H200.
set -u
source benchmarks/device_env.sh || exit 1
D=docs/benchmark_results/h200-runs-2026-12-07/run118-conversions
case ${1:-check} in
variants)
  mkdir -p $OUT/variants
  for v in main copies vscale kbias; do cp $D/${v}_cuda.py kernels/cuda_$v.py; done
  sed 's/chunk_tokens=64/chunk_tokens=128/' $D/main_cuda.py > kernels/cuda_main128.py
  sed 's/chunk_tokens=64/chunk_tokens=128/' kernels/cuda.py > kernels/cuda_branch128.py
  MLXCEL_KERNELS=fused timeout 300 python3 $D/variants.py /tmp/var > $OUT/variants/variants.log 2>&1
  echo "variants exit $? at $SECONDS s"; cp /tmp/var/* $OUT/variants/ 2>/dev/null; cat $OUT/variants/variants.md
  grep "difference" $OUT/variants/variants.log; tail -2 $OUT/variants/variants.log | cut -c1-400 ;;
refill)
  mkdir -p $OUT/refill; cp $D/main_cuda.py kernels/cuda_main.py
  for v in after_scores after_softmax chains; do cp $D/${v}_cuda.py kernels/cuda_$v.py; done
  MLXCEL_KERNELS=fused timeout 300 python3 $D/variants.py /tmp/refill after_scores=cuda_after_scores \
    after_softmax=cuda_after_softmax chains=cuda_chains > $OUT/refill/variants.log 2>&1
  echo "refill exit $? at $SECONDS s"; cp /tmp/refill/* $OUT/refill/ 2>/dev/null; cat $OUT/refill/variants.md
  grep "difference" $OUT/refill/variants.log; tail -2 $OUT/refill/variants.log | cut -c1-400 ;;
sass)
  bash docs/benchmark_results/h200-runs-2026-12-07/run115-flat-stages/run.sh sass
  gzip -f $OUT/sass/sass.csv ;;
check)
mkdir -p $OUT/tests $OUT/ab
MLXCEL_POISON_OUTPUTS=nan timeout 330 python3 -m pytest -q -x tests/test_fused_kernels.py tests/test_quantized_kv.py \
  -k "int8 or int4 or quantized" > $OUT/tests/pytest.txt 2>&1
echo "tests exit $? at $SECONDS s"; tail -5 $OUT/tests/pytest.txt | cut -c1-300
cp $D/main_cuda.py kernels/cuda_main.py
MLXCEL_KERNELS=fused timeout 200 python3 $D/ab.py /tmp/ab > $OUT/ab/ab.log 2>&1
echo "ab exit $? at $SECONDS s"; cp /tmp/ab/* $OUT/ab/ 2>/dev/null; cat $OUT/ab/ab.md
grep "int8:" $OUT/ab/ab.log; tail -3 $OUT/ab/ab.log | cut -c1-400 ;;
esac
