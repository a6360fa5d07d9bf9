# more reads of the slope-timed bench (one of the previous bench beside), GPU timeline, end to end (validates 882d216/8763088 in the engine)
bash ab_step/install.sh
export PYTHONPATH=/tmp/site:/tmp/mlxcel-shim:$PWD:$PWD/tests:$PWD/benchmarks:$PWD/ab_step
export MLXCEL_KERNELS=fused
A="--shared 2048,8192,32768 --batches 4,8,32,64 --reps 10 --copy-mib 256 --matmul-n 4096"
for r in new1 new2 old1 new3 new4; do
  if [ ${r%?} = new ]; then f=benchmarks/gpu_attention_bench.py; else f=ab_step/bench_old.py; fi
  timeout 100 python3 $f --out /tmp/$r $A > /tmp/$r.log 2>&1
  echo "== $r" >> $OUT/bench.txt; grep "^| \|^copy" /tmp/$r.log >> $OUT/bench.txt
  echo "$r done $SECONDS s"; grep "^| 8192 | 32 " /tmp/$r.log | cut -c1-120
done
timeout 100 python3 benchmarks/gpu_timeline.py --out /tmp/tl > /tmp/tl.log 2>&1; cp /tmp/tl/timeline.md $OUT/ 2>/dev/null || tail -20 /tmp/tl.log
echo "timeline done $SECONDS s"; sed -n 5,12p $OUT/timeline.md
unset MLXCEL_KERNELS
GPU_SUITE_E2E=only timeout 330 bash benchmarks/gpu_suite.sh /tmp/e2e .whl-b .whl-lm > /tmp/e2e.log 2>&1
cp /tmp/e2e/e2e_bench.md /tmp/e2e/e2e_bench.json $OUT/ 2>/dev/null; tail -5 /tmp/e2e.log > $OUT/e2e_tail.txt
echo "e2e done $SECONDS s"; grep "^| " $OUT/e2e_bench.md | head -8
