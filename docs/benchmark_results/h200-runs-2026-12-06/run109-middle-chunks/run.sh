# Run 109: middle prefill chunks' K/V, stored by the q/k/v kernel, evaluated (the step evaluates the last
# layer's store). The bf16 accuracy test with prompts in chunks of 24 tokens on main and on the engine before
# the fix (.base: a0f6c27's engine with main's test file), then the 8 x 2K teacher-forced e2e read on main.
# Device calls: carry .whl-b .whl-lm .base after a call that copied .whl-a into /tmp/w. Output: $OUT.
set -u
source benchmarks/device_env.sh || exit 1
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_engine.py \
  -k "gpu_step_with_a_prefill or bfloat16_steps" > $OUT/main-test.log 2>&1
echo "main: exit $?"; tail -1 $OUT/main-test.log
mkdir -p /tmp/baseshim/mlxcel && ln -sfn $PWD/.base/engine /tmp/baseshim/mlxcel/engine \
  && ln -sfn $PWD/.base/kernels /tmp/baseshim/mlxcel/kernels
(cd .base && PYTHONPATH=/tmp/site:/tmp/baseshim:$PWD:$PWD/tests:$PWD/benchmarks timeout 90 python3 -m pytest -q \
  -p no:cacheprovider tests/test_engine.py -k "bfloat16_steps" > $OUT/before-test.log 2>&1)
echo "before the fix: exit $?"; grep -E "^E  |passed|failed" $OUT/before-test.log | tail -4 | cut -c1-300
timeout 200 python3 benchmarks/gpu_e2e_bench.py --out /tmp/e2e-small --skip-mlx-lm --concurrency 8 \
  --shared 2048 --new-tokens 24 > $OUT/e2e.log 2>&1
echo "e2e exit $? at $SECONDS s"; cp /tmp/e2e-small/e2e_bench.json /tmp/e2e-small/e2e_bench.md $OUT/ 2>/dev/null
grep -o '"argmax_steps": [0-9]*' $OUT/e2e_bench.md | sort | uniq -c; head -6 $OUT/e2e_bench.md
