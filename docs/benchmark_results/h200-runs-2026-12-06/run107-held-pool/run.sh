# Run 107: the GPU test of steps with a prefill chunk (a view of every layer's pool held; MLX's peak memory in
# those steps under a quarter of a layer pool) on main and on the engine before the change (.base, with main's
# test file), where it must fail; then a short e2e read with its teacher-forced check. Device calls: carry
# .whl-b .whl-lm .base after a call that copied .whl-a into /tmp/w. Output: out/.
#   run.sh tests   the held-pool test (and the bf16 accuracy tests) on main, the held-pool test on .base
#   run.sh e2e     8 x 2K, 24 tokens, no mlx-lm arm: every arm's tokens teacher-forced (out-e2e/: main failed it)
set -u
source benchmarks/device_env.sh || exit 1
case $1 in
tests)
  timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_engine.py \
    -k "gpu_step_with_a_prefill or bfloat16_steps" > $OUT/main-test.log 2>&1
  echo "main: exit $?"; tail -1 $OUT/main-test.log
  mkdir -p /tmp/baseshim/mlxcel && ln -sfn $PWD/.base/engine /tmp/baseshim/mlxcel/engine \
    && ln -sfn $PWD/.base/kernels /tmp/baseshim/mlxcel/kernels
  cp tests/test_engine.py .base/tests/test_engine.py
  (cd .base && PYTHONPATH=/tmp/site:/tmp/baseshim:$PWD:$PWD/tests:$PWD/benchmarks timeout 90 python3 -m pytest -q \
    -p no:cacheprovider tests/test_engine.py -k "gpu_step_with_a_prefill" > $OUT/before-test.log 2>&1)
  echo "before the change: exit $?"; grep -E "^E  |passed|failed" $OUT/before-test.log | tail -4 | cut -c1-300 ;;
e2e)
  timeout 200 python3 benchmarks/gpu_e2e_bench.py --out /tmp/e2e-small --skip-mlx-lm --concurrency 8 \
    --shared 2048 --new-tokens 24 > $OUT/e2e.log 2>&1
  echo "e2e exit $? at $SECONDS s"; cp /tmp/e2e-small/e2e_bench.json /tmp/e2e-small/e2e_bench.md $OUT/ 2>/dev/null
  grep -iE "teacher|rank|gap|agree" $OUT/e2e_bench.md | head -12 ;;
esac
