# five full reads of the attention bench, back to back
export PYTHONPATH=/tmp/site:/tmp/mlxcel-shim:$PWD:$PWD/tests:$PWD/benchmarks:$PWD/ab_step
for i in 1 2 3 4 5; do
  MLXCEL_KERNELS=fused timeout 110 python3 benchmarks/gpu_attention_bench.py --out $OUT/read$i --shared 2048,8192,32768 --batches 4,8,32,64 --reps 10 --copy-mib 256 --matmul-n 4096 > $OUT/read$i.log 2>&1
  grep "^copy\|^| 8192 | 32 " $OUT/read$i/attention_bench.md
done
