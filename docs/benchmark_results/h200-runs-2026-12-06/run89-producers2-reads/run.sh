# Run 89 (git branch producers2, after run 88's probe read it faster): the reads that decide the merge.
# `run.sh e2e`, twice on one warm machine: the 32 x 32K cell (bf16 and int8 pages, cascade and flat, ABBA in one
# process). `run.sh tests`: every int8 fused-kernel GPU test under NaN poisoning.
# Device calls: carry .whl-b .whl-lm after a call that copied .whl-a into /tmp/w. Output: e2e-*/ and tests.log.
set -u
source benchmarks/device_env.sh || exit 1
if [ "$1" = tests ]; then
  MLXCEL_POISON_OUTPUTS=nan timeout 300 python3 -m pytest -q -x tests/test_fused_kernels.py -k "int8" \
    > $OUT/tests.log 2>&1
  echo "tests exit $? at $SECONDS s"; tail -3 $OUT/tests.log | cut -c1-300
else
  out=$OUT/e2e-$(date +%s); mkdir -p $out
  timeout 400 python3 benchmarks/gpu_e2e_bench.py --out /tmp/e2e32 --shared 32768 --kv-dtypes bfloat16,int8 \
    --skip-mlx-lm > $out/e2e.log 2>&1
  echo "e2e exit $? at $SECONDS s"
  cp /tmp/e2e32/e2e_bench.json /tmp/e2e32/e2e_bench.md $out/; grep "^| " $out/e2e_bench.md
fi
