# Run 106: the q/k/v kernel storing K/V in steps with a prefill chunk (the gathers ordered after it through
# indices made from q) against main's scatter, at a server-sized pool. Needs .base (git archive of main's engine,
# kernels, benchmarks and tests, before the change). Device calls: carry .whl-b .whl-lm .base after a call that
# copied .whl-a into /tmp/w. Output: out/.
set -u
source benchmarks/device_env.sh || exit 1
D=docs/benchmark_results/h200-runs-2026-12-06/run106-prefill-store
timeout 100 python3 -m pytest -q -p no:cacheprovider tests/test_engine.py -k "gpu_step_with_a_prefill or bfloat16_steps" \
  > $OUT/gpu-test.log 2>&1
echo "tests exit $?"; tail -2 $OUT/gpu-test.log
mkdir -p /tmp/baseshim/mlxcel && ln -sfn $PWD/.base/engine /tmp/baseshim/mlxcel/engine \
  && ln -sfn $PWD/.base/kernels /tmp/baseshim/mlxcel/kernels
cp tests/test_engine.py .base/tests/test_engine.py
(cd .base && PYTHONPATH=/tmp/site:/tmp/baseshim:$PWD:$PWD/tests:$PWD/benchmarks timeout 60 python3 -m pytest -q \
  -p no:cacheprovider tests/test_engine.py -k "gpu_step_with_a_prefill" > $OUT/base-test.log 2>&1)
echo "main's engine under the new test: exit $?"; grep -E "assert|passed|failed" $OUT/base-test.log | tail -3 | cut -c1-300
for arm in main tree; do
  if [ $arm = main ]; then P=/tmp/site:/tmp/baseshim:$PWD/.base:$PWD/.base/tests:$PWD/.base/benchmarks; else P=$PYTHONPATH; fi
  PYTHONPATH=$P timeout 230 python3 $D/probe.py /tmp/p-$arm > $OUT/probe-$arm.log 2>&1
  echo "$arm exit $? at $SECONDS s"; grep '^{' $OUT/probe-$arm.log
done
python3 $D/compare.py /tmp/p-main/tokens.json /tmp/p-tree/tokens.json | tee $OUT/compare.txt
