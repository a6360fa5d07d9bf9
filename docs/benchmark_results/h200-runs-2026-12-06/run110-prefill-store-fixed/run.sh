# Run 110: run 106's probe again (issue 18's cell at a 5,000-page pool, rows joining one a step with their
# chunks; bf16 and int8 pages) with middle chunks' K/V evaluated (run 109's fix), against the engine before
# prefill chunks stored K/V in the kernel (.base-pre: 9f6a39f's engine, kernels, benchmarks and tests).
# Device calls: carry .base-pre on a machine where .whl-a and .whl-b are installed. Output: $OUT.
set -u
source benchmarks/device_env.sh || exit 1
D=docs/benchmark_results/h200-runs-2026-12-06/run106-prefill-store
mkdir -p /tmp/preshim/mlxcel && ln -sfn $PWD/.base-pre/engine /tmp/preshim/mlxcel/engine \
  && ln -sfn $PWD/.base-pre/kernels /tmp/preshim/mlxcel/kernels
for arm in before tree; do
  if [ $arm = before ]; then P=/tmp/site:/tmp/preshim:$PWD/.base-pre:$PWD/.base-pre/tests:$PWD/.base-pre/benchmarks
  else P=$PYTHONPATH; fi
  PYTHONPATH=$P timeout 240 python3 $D/probe.py /tmp/p-$arm > $OUT/probe-$arm.log 2>&1
  echo "$arm exit $? at $SECONDS s"; grep '^{' $OUT/probe-$arm.log | cut -c1-400
done
python3 $D/compare.py /tmp/p-before/tokens.json /tmp/p-tree/tokens.json | tee $OUT/compare.txt
