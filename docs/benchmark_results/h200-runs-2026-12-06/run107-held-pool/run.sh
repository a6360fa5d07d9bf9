# Run 107: the GPU test of steps with a prefill chunk (a view of every layer's pool held, MLX's peak memory in
# those steps under a quarter of a layer pool) on the tree and on main's engine (.base, with the tree's test
# file), where it must fail. Device calls: carry .whl-b .whl-lm .base after a call that copied .whl-a into
# /tmp/w. Output: out/. Then a short e2e read of the tree with its teacher-forced check.
set -u
source benchmarks/device_env.sh || exit 1
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_engine.py -k "gpu_step_with_a_prefill or bfloat16_steps" \
  > $OUT/tree-test.log 2>&1
echo "tree: exit $?"; tail -1 $OUT/tree-test.log
mkdir -p /tmp/baseshim/mlxcel && ln -sfn $PWD/.base/engine /tmp/baseshim/mlxcel/engine \
  && ln -sfn $PWD/.base/kernels /tmp/baseshim/mlxcel/kernels
cp tests/test_engine.py .base/tests/test_engine.py
(cd .base && PYTHONPATH=/tmp/site:/tmp/baseshim:$PWD:$PWD/tests:$PWD/benchmarks timeout 90 python3 -m pytest -q \
  -p no:cacheprovider tests/test_engine.py -k "gpu_step_with_a_prefill" > $OUT/main-test.log 2>&1)
echo "main's engine: exit $?"; grep -E "^E  |passed|failed" $OUT/main-test.log | tail -4 | cut -c1-300
# The tree's tokens teacher-forced at a smaller cell of issue 18's model (8 x 2K, 24 tokens): every arm's
# tokens mlx-lm's argmax or a near-tie, with prefill chunks stored by the kernel.
timeout 200 python3 benchmarks/gpu_e2e_bench.py --out /tmp/e2e-small --skip-mlx-lm --concurrency 8 --shared 2048 \
  --new-tokens 24 > $OUT/e2e.log 2>&1
echo "e2e exit $? at $SECONDS s"; cp /tmp/e2e-small/e2e_bench.json /tmp/e2e-small/e2e_bench.md $OUT/ 2>/dev/null
grep -iE "teacher|rank|gap|agree" $OUT/e2e_bench.md | head -12
