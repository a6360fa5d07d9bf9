# validate 8763088/3204e1a (smoke + 102 GPU tests), GPU timeline via CUPTI (torch.profiler), chain A/B,
# MLX ops-per-graph sweep, one full bench read with GPU clocks logged
bash ab_step/install.sh
export PYTHONPATH=/tmp/site:/tmp/mlxcel-shim:$PWD:$PWD/tests:$PWD/benchmarks:$PWD/ab_step
export MLXCEL_KERNELS=fused
T=$OUT/tests.txt
timeout 90 python3 -c "
import gpu_attention_bench as b
c = b.Cell(2048, 256, 8); s = c.sdpa_call()(0)
print('smoke', b.relative_error(c.cascade(0), s), b.relative_error(c.flat(0), s))
" > $T 2>&1
ls -la ~/.cache/mlxcel/kernels/ >> $T 2>&1
MLXCEL_POISON_OUTPUTS=nan timeout 200 python3 -m pytest -q tests/test_fused_kernels.py tests/test_cascade_planner.py -p no:cacheprovider 2>&1 | tail -3 >> $T
echo "tests done $SECONDS s"
timeout 150 python3 ab_step/kineto_step.py $OUT 8192 32 100 > $OUT/kineto.txt 2>&1
echo "kineto done $SECONDS s"; tail -4 $OUT/kineto.txt
timeout 120 python3 ab_step/ab_chain.py 8192 32 15 > $OUT/ab_chain.txt 2>&1
echo "chain done $SECONDS s"; tail -3 $OUT/ab_chain.txt
for ops in 25 400 100; do
  echo "== MLX_MAX_OPS_PER_BUFFER=$ops" >> $OUT/ops.txt
  MLX_MAX_OPS_PER_BUFFER=$ops timeout 60 python3 benchmarks/gpu_attention_bench.py --out /tmp/ops$ops --shared 8192 --batches 32 --reps 10 --copy-mib 64 --matmul-n 1024 2>&1 | grep "^| 8192" >> $OUT/ops.txt
done
echo "ops done $SECONDS s"
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,utilization.gpu,temperature.gpu --format=csv -lms 100 > $OUT/clocks.csv &
timeout 200 python3 -u benchmarks/gpu_attention_bench.py --out /tmp/bench --shared 2048,8192,32768 --batches 4,8,32,64 --reps 10 --copy-mib 256 --matmul-n 4096 2>&1 | while IFS= read -r l; do echo "$(date +%T.%N) $l"; done > $OUT/bench.txt
kill %1
echo "bench done $SECONDS s"; grep "^[0-9:.]* | 8192 | 32" $OUT/bench.txt
