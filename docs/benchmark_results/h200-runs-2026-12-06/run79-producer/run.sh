# Run 79 (git branch producer; producer.patch on main at b733aa9): the int8 warpgroup GPU tests of blocks of two
# warpgroups under NaN poisoning, probe.py (main's kernel against the branch's, 8K and 32K x 32), then, where the
# branch read faster at 32K, the 32 x 32K end-to-end cell. Device calls: carry .whl-b .whl-lm after a call that
# copied .whl-a into /tmp/w.
set -u
source benchmarks/device_env.sh || exit 1
D=docs/benchmark_results/h200-runs-2026-12-06/run79-producer
MLXCEL_POISON_OUTPUTS=nan timeout 150 python3 -m pytest -q -x tests/test_fused_kernels.py \
  -k "int8-2- and warpgroup" > $OUT/tests.log 2>&1
echo "tests exit $? at $SECONDS s"; tail -3 $OUT/tests.log | cut -c1-300
timeout 100 python3 $D/probe.py /tmp/probe > $OUT/probe.log 2>&1
echo "probe exit $? at $SECONDS s"; cp /tmp/probe/* $OUT/ 2>/dev/null; cat $OUT/probe.md
tail -2 $OUT/probe.log | cut -c1-600
[ -e /tmp/probe/faster ] || exit 0
timeout 330 python3 benchmarks/gpu_e2e_bench.py --out /tmp/e2e32 --shared 32768 --kv-dtypes bfloat16,int8 \
  --skip-mlx-lm > $OUT/e2e.log 2>&1
echo "e2e exit $? at $SECONDS s"
cp /tmp/e2e32/e2e_bench.json /tmp/e2e32/e2e_bench.md $OUT/; grep "^| " $OUT/e2e_bench.md
tail -3 $OUT/e2e.log | cut -c1-300
