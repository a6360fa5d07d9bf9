# slope-timed bench vs the previous bench (old: HEAD~'s file), alternated; GPU timeline tool; level-1 A/B
bash ab_step/install.sh
export PYTHONPATH=/tmp/site:/tmp/mlxcel-shim:$PWD:$PWD/tests:$PWD/benchmarks:$PWD/ab_step
export MLXCEL_KERNELS=fused
timeout 60 python3 -m pytest -q tests/test_gpu_bench_harness.py -p no:cacheprovider 2>&1 | tail -1 > $OUT/harness_test.txt
A="--shared 2048,8192,32768 --batches 4,8,32,64 --reps 10 --copy-mib 256 --matmul-n 4096"
for r in new1 old1 new2 old2; do
  if [ ${r%?} = new ]; then f=benchmarks/gpu_attention_bench.py; else f=ab_step/bench_old.py; fi
  timeout 100 python3 $f --out /tmp/$r $A > /tmp/$r.log 2>&1
  echo "== $r" >> $OUT/bench.txt; grep "^| \|^copy" /tmp/$r.log >> $OUT/bench.txt
  echo "$r done $SECONDS s"; grep "^| 8192 | 32 " /tmp/$r.log
done
timeout 120 python3 benchmarks/gpu_timeline.py --out /tmp/tl > /tmp/tl.log 2>&1; cp /tmp/tl/timeline.md $OUT/ 2>/dev/null || tail -20 /tmp/tl.log
echo "timeline done $SECONDS s"; head -14 $OUT/timeline.md
timeout 200 python3 ab_step/ab_level1.py 8192x32,32768x32,8192x64,2048x64 12 > $OUT/ab_level1.txt 2>&1
echo "level1 done $SECONDS s"; grep -v "^{" $OUT/ab_level1.txt | tail -12
