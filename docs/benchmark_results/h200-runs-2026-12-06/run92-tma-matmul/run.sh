# Run 92 (git branch tma): producer_matmul with TMA tensor copies (a copy warp: lane 0 one box of the block's weight
# rows a 64-k chunk through the weight's tensor map, its lanes x's rows by cp.async; consumer warp w takes chunks w,
# w + 4, ..., sums meeting at a tile's end as skinny_matmul's). Its GPU tests against float64 (three processes; a
# hang shows as a log's last test), the matmul bench at 32 rows (cuBLAS, skinny_matmul's pick, producer_tiles' pick,
# three producer shapes), then, where the producer's gate/up read faster than the skinny kernel's, probe.py (the
# engine's decode step on each kernel, A B B A in one process). Device calls: carry .whl-b .whl-lm after a call that
# copied .whl-a into /tmp/w. Output: out/.
set -u
source benchmarks/device_env.sh || exit 1
D=docs/benchmark_results/h200-runs-2026-12-06/run92-tma-matmul
T="python3 -m pytest -v -p no:cacheprovider -rf tests/test_cuda_matmul.py"
timeout 120 $T -k "producer and bfloat16 and not compiles" > $OUT/tests_bf16.log 2>&1 & A=$!
timeout 120 $T -k "producer and float16 and not bfloat16 and not compiles" > $OUT/tests_f16.log 2>&1 & B=$!
timeout 120 $T -k "looping_producer" > $OUT/tests_loop.log 2>&1 & C=$!
wait $A; RA=$?; wait $B; RB=$?; wait $C; RC=$?
echo "tests exit $RA (bf16) $RB (f16) $RC (looping) at $SECONDS s"
LOGS="$OUT/tests_bf16.log $OUT/tests_f16.log $OUT/tests_loop.log"
for log in $LOGS; do grep -E "^FAILED|^ERROR|passed|failed|skipped" $log | tail -8 | cut -c1-250; done
if [ $RA -ne 0 ] || [ $RB -ne 0 ] || [ $RC -ne 0 ]; then
  for log in $LOGS; do tail -3 $log | cut -c1-300; grep -E "^E " $log | head -12 | cut -c1-300; done
  exit 1
fi
timeout 200 python3 benchmarks/gpu_matmul_bench.py --out /tmp/mm --rows 32 --producer --sweep \
  --sweep-tiles p8x4x16 p4x4x16 p6x4x16 p8x4x8 p4x2x16 > $OUT/matmul.log 2>&1
echo "bench exit $? at $SECONDS s"; cp /tmp/mm/matmul.* $OUT/ 2>/dev/null
cat $OUT/matmul.md 2>/dev/null | cut -c1-160; grep -E "Error|error:" $OUT/matmul.log | head -3 | cut -c1-300
python3 - $OUT/matmul.json <<'PY' || exit 0
import json, sys
rows = json.load(open(sys.argv[1]))["results"]
gu = {r["arm"]: r["gpu_us"] for r in rows if r["shape"] == "gate_up"}
skinny = min(v for k, v in gu.items() if k.startswith("skinny"))
producer = min(v for k, v in gu.items() if k.startswith("producer"))
print(f"gate_up: skinny {skinny:.2f} us, producer {producer:.2f} us")
sys.exit(0 if producer < skinny else 1)
PY
timeout $((560 - SECONDS)) python3 $D/probe.py /tmp/probe > $OUT/probe.log 2>&1
echo "probe exit $? at $SECONDS s"; cp /tmp/probe/* $OUT/ 2>/dev/null; cat $OUT/probe.md 2>/dev/null
tail -2 $OUT/probe.log | cut -c1-400
