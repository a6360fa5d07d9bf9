# Final H200 run, part 2 (same warm machine as part 1): the end-to-end bench and the step profile of issue 18,
# then the tensor-parallel bench's one-GPU smoke (NCCL with one rank; issue 25 needs two GPUs).
# PRE=1 runs the decode path as it was before the forest merge (.pre-forest/, carried), should part 1 fail.
set -u
src=$PWD; [ "${PRE:-0}" = 1 ] && src=$PWD/.pre-forest
ln -sfn $src/engine /tmp/mlxcel-shim/mlxcel/engine && ln -sfn $src/kernels /tmp/mlxcel-shim/mlxcel/kernels
export PYTHONPATH=/tmp/site:/tmp/mlxcel-shim:$PWD:$PWD/tests:$src/benchmarks PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
timeout 290 python3 $src/benchmarks/gpu_e2e_bench.py --out /tmp/e2e > $OUT/e2e.log 2>&1; echo "e2e exit $? at $SECONDS s"
cp /tmp/e2e/e2e_bench.json /tmp/e2e/e2e_bench.md $OUT/ 2>/dev/null; grep "^| " $OUT/e2e_bench.md; tail -3 $OUT/e2e.log
timeout $((500 - SECONDS)) python3 $src/benchmarks/gpu_step_profile.py --out /tmp/prof > $OUT/profile.log 2>&1
echo "profile exit $? at $SECONDS s"; cp /tmp/prof/step_profile.json /tmp/prof/step_profile.md $OUT/ 2>/dev/null
grep "^| \|^tokens" $OUT/step_profile.md
NCCL_NVLS_ENABLE=0 timeout $((585 - SECONDS)) python3 benchmarks/gpu_tp_bench.py --out /tmp/tp --ranks 1 \
  --num-layers 8 --sessions 8 --shared 2048 > $OUT/tp.log 2>&1; echo "tp smoke exit $? at $SECONDS s"; tail -4 $OUT/tp.log; cp /tmp/tp/report.json $OUT/tp_report.json 2>/dev/null
