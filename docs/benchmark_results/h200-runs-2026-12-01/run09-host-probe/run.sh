# Host-time probe of the decode step (issue 18): MLX's CUDA graph settings and where the host's time goes.
# Device call: carry .whl-b .whl-lm after a call that copied .whl-a into /tmp/w.
set -u
cp .whl-b/* /tmp/w/ && cat /tmp/w/part.* > /tmp/w/mlx_cuda_13-0.32.4-py3-none-manylinux_2_35_x86_64.whl && rm /tmp/w/part.*
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site /tmp/w/*.whl .whl-lm/*.whl || exit 1
mkdir -p /tmp/mlxcel-shim/mlxcel && ln -sfn $PWD/engine /tmp/mlxcel-shim/mlxcel/engine && ln -sfn $PWD/kernels /tmp/mlxcel-shim/mlxcel/kernels
here=docs/benchmark_results/h200-runs-2026-12-01/run09-host-probe
export PYTHONPATH=/tmp/site:/tmp/mlxcel-shim:$PWD:$PWD/tests:$PWD/benchmarks:$here PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
export MLX_PTX_CACHE_DIR=/tmp/ptx
echo "installed at $SECONDS s"
timeout 60 python3 $here/compile_check.py > $OUT/compile_check.log 2>&1; echo "compile check exit $? at $SECONDS s"
cat $OUT/compile_check.log | tail -12
timeout 150 python3 $here/host_probe.py default --profile > $OUT/probe-default.log 2>&1; echo "default exit $? at $SECONDS s"
grep "^default" $OUT/probe-default.log
MLX_MAX_MB_PER_BUFFER=1000000 timeout 100 python3 $here/host_probe.py mb-unlimited > $OUT/probe-mb.log 2>&1
echo "mb exit $? at $SECONDS s"; grep "^mb" $OUT/probe-mb.log
MLX_USE_CUDA_GRAPHS=0 timeout 100 python3 $here/host_probe.py no-graphs > $OUT/probe-nographs.log 2>&1
echo "nographs exit $? at $SECONDS s"; grep "^no-graphs" $OUT/probe-nographs.log
MLX_MAX_MB_PER_BUFFER=1000000 MLX_MAX_OPS_PER_BUFFER=40 timeout $((580 - SECONDS)) python3 $here/host_probe.py mb-unlimited-ops40 > $OUT/probe-mb40.log 2>&1
echo "mb40 exit $? at $SECONDS s"; grep "^mb-" $OUT/probe-mb40.log
