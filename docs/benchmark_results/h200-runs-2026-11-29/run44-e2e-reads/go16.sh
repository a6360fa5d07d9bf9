# end to end (gpu_suite's step 4), then three full reads of the attention bench on the same machine
GPU_SUITE_E2E=only bash benchmarks/gpu_suite.sh $OUT/e2e .whl-b .whl-lm 2>&1 | tail -30
export PYTHONPATH=/tmp/site:/tmp/mlxcel-shim:$PWD:$PWD/tests:$PWD/benchmarks:$PWD/ab_step
bash ab_step/install.sh
for i in 6 7 8; do
  MLXCEL_KERNELS=fused timeout 110 python3 benchmarks/gpu_attention_bench.py --out $OUT/read$i --shared 2048,8192,32768 --batches 4,8,32,64 --reps 10 --copy-mib 256 --matmul-n 4096 > $OUT/read$i.log 2>&1
  grep "^copy\|^| 8192 | 32 " $OUT/read$i/attention_bench.md
  rm -f $OUT/read$i/attention_bench.json
done
ls -R $OUT | head -30
