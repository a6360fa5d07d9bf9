# Run 100: the matmul bench's producer arm with each weight's tensor map made once (as the engine's), two reads
# on the warm H100 of run 99 (its install). Output: mm1/, mm2/ and their logs.
source benchmarks/device_env.sh >/dev/null || exit 1
for r in 1 2; do
  timeout 200 python3 benchmarks/gpu_matmul_bench.py --out /tmp/mm$r --rows 32 --producer > $OUT/mm$r.log 2>&1
  echo "read $r exit $? at $SECONDS s"; mkdir -p $OUT/mm$r; cp /tmp/mm$r/* $OUT/mm$r/ 2>/dev/null
  grep "^|" $OUT/mm$r/*.md | head -12
done
