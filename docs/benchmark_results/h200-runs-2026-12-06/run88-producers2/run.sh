# Run 88 (git branch producers2, not yet run): the int8 warpgroup GPU tests of blocks of two warpgroups under NaN
# poisoning (a launch of 512 threads needs <= 128 registers a thread: the tests fail if NVRTC's build takes more),
# probe.py (main's kernel against the branch's, 8K and 32K x 32), then where the branch read faster at 32K the
# kernel bench's KV-dtype arms once. Device calls: carry .whl-b .whl-lm after a call that copied .whl-a into
# /tmp/w. Output: out/.
set -u
source benchmarks/device_env.sh || exit 1
D=docs/benchmark_results/h200-runs-2026-12-06/run88-producers2
MLXCEL_POISON_OUTPUTS=nan timeout 100 python3 -m pytest -q -x tests/test_fused_kernels.py \
  -k "int8-2- and warpgroup" > $OUT/tests.log 2>&1
echo "tests exit $? at $SECONDS s"; tail -3 $OUT/tests.log | cut -c1-300
timeout 60 python3 $D/probe.py /tmp/probe > $OUT/probe.log 2>&1
echo "probe exit $? at $SECONDS s"; cp /tmp/probe/* $OUT/ 2>/dev/null; cat $OUT/probe.md
tail -2 $OUT/probe.log | cut -c1-600
[ -e /tmp/probe/faster ] || exit 0
MLXCEL_KERNELS=fused timeout 60 python3 benchmarks/gpu_attention_bench.py --out /tmp/att --kv-dtypes-only --reps 10 \
  --copy-mib 256 --matmul-n 4096 > $OUT/attention.log 2>&1
echo "attention exit $? at $SECONDS s"; cp /tmp/att/attention_bench.json /tmp/att/attention_bench.md $OUT/ 2>/dev/null
tail -16 $OUT/attention_bench.md 2>/dev/null
