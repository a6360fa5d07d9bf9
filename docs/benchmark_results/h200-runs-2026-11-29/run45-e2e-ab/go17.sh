# end-to-end A/B on one machine: 190626c's kernels vs this tree's (engine arms only, ABBA), model generated once
bash ab_step/install.sh
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl-lm/*.whl
base=/tmp/site:$PWD:$PWD/tests:$PWD/benchmarks
for arm in old new; do
  mkdir -p /tmp/mlxcel-ab/$arm/mlxcel && ln -sfn $PWD/engine /tmp/mlxcel-ab/$arm/mlxcel/engine
done
ln -sfn $PWD/.ab/190626c/kernels /tmp/mlxcel-ab/old/mlxcel/kernels
ln -sfn $PWD/kernels /tmp/mlxcel-ab/new/mlxcel/kernels
for run in old-1 new-1 new-2 old-2; do
  arm=${run%-*}
  PYTHONPATH=/tmp/site:/tmp/mlxcel-ab/$arm:$PWD/tests:$PWD/benchmarks timeout 330 python3 benchmarks/gpu_e2e_bench.py --out $OUT/$run --skip-mlx-lm > $OUT/$run.log 2>&1
  echo "== $run"; grep "^| \(cascade\|flat\)\|model_generate" $OUT/$run.log
done
