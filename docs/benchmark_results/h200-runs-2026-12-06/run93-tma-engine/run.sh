# Run 93 (git branch tma): the engine's decode step with gate/up on producer_matmul through its tensor map (a
# tensor map a gate/up weight, made at load; the traces take it as an input). The producer kernel's GPU tests
# (two 32-row boxes a stage now), then probe.py (the step on each kernel, A B B A in one process, tokens
# checked). Device calls: carry .whl-b .whl-lm after a call that copied .whl-a into /tmp/w. Output: out/.
set -u
source benchmarks/device_env.sh || exit 1
D=docs/benchmark_results/h200-runs-2026-12-06/run93-tma-engine
T="python3 -m pytest -v -p no:cacheprovider -rf tests/test_cuda_matmul.py"
timeout 100 $T -k "producer and bfloat16 and not compiles" > $OUT/tests_bf16.log 2>&1 & A=$!
timeout 100 $T -k "producer and float16 and not bfloat16 and not compiles" > $OUT/tests_f16.log 2>&1 & B=$!
timeout 100 $T -k "looping_producer" > $OUT/tests_loop.log 2>&1 & C=$!
wait $A; RA=$?; wait $B; RB=$?; wait $C; RC=$?
echo "tests exit $RA (bf16) $RB (f16) $RC (looping) at $SECONDS s"
for log in $OUT/tests_*.log; do grep -E "^FAILED|^ERROR|passed|failed" $log | tail -6 | cut -c1-250; done
[ $RA -ne 0 ] || [ $RB -ne 0 ] || [ $RC -ne 0 ] && exit 1
timeout $((290 - SECONDS)) python3 $D/probe.py /tmp/probe > $OUT/probe.log 2>&1
echo "probe exit $? at $SECONDS s"; cp /tmp/probe/* $OUT/ 2>/dev/null; cat $OUT/probe.md 2>/dev/null
grep -v '^{' $OUT/probe.log | tail -4 | cut -c1-400
