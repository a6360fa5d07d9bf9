# end to end: each decode layer's attention handed to mx.async_eval while the rest of the step is built, ABBA
bash ab_step/install.sh
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl-lm/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:/tmp/mlxcel-shim:$PWD:$PWD/tests:$PWD/benchmarks:$PWD/ab_step HF_HUB_OFFLINE=1
for run in sync-1 async-1 async-2 sync-2; do
  timeout 300 python3 ab_step/e2e_async.py ${run%-*} --out /tmp/$run --skip-mlx-lm > /tmp/$run.log 2>&1
  echo "== $run $SECONDS s" | tee -a $OUT/e2e_async.txt; grep "^| \(cascade\|flat\)\|model_generate\|^{\"cascade_vs" /tmp/$run.log | cut -c1-400 | tee -a $OUT/e2e_async.txt
done
