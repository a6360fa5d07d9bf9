# GPU tests, then end-to-end A/B on one machine: 8793f24's kernels vs this tree's (engine arms only, ABBA), model generated once
bash ab_step/install.sh
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl-lm/*.whl
PYTHONPATH=/tmp/site:/tmp/mlxcel-shim:$PWD:$PWD/tests:$PWD/benchmarks MLXCEL_KERNELS=fused MLXCEL_POISON_OUTPUTS=nan timeout 200 python3 -m pytest -q tests/test_fused_kernels.py tests/test_cascade_planner.py -p no:cacheprovider --junitxml=$OUT/gpu_tests.xml 2>&1 | tail -3 | tee $OUT/tests.txt
for arm in old new; do
  mkdir -p /tmp/mlxcel-ab/$arm/mlxcel && ln -sfn $PWD/engine /tmp/mlxcel-ab/$arm/mlxcel/engine
done
ln -sfn $PWD/.ab/8793f24/kernels /tmp/mlxcel-ab/old/mlxcel/kernels
ln -sfn $PWD/kernels /tmp/mlxcel-ab/new/mlxcel/kernels
for run in old-1 new-1 new-2 old-2; do
  arm=${run%-*}
  PYTHONPATH=/tmp/site:/tmp/mlxcel-ab/$arm:$PWD/tests:$PWD/benchmarks timeout 300 python3 benchmarks/gpu_e2e_bench.py --out $OUT/$run --skip-mlx-lm > $OUT/$run.log 2>&1
  echo "== $run"; grep "^| \(cascade\|flat\)\|model_generate" $OUT/$run.log
done
