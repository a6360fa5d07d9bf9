# The host's cost per op kind (graphs on and off), and the probe with MLX's graph byte limit lifted.
# Device call: carry .whl-b .whl-lm after .whl-a.
set -u
cp .whl-b/* /tmp/w/ && cat /tmp/w/part.* > /tmp/w/mlx_cuda_13-0.32.4-py3-none-manylinux_2_35_x86_64.whl && rm /tmp/w/part.*
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site /tmp/w/*.whl .whl-lm/*.whl || exit 1
mkdir -p /tmp/mlxcel-shim/mlxcel && ln -sfn $PWD/engine /tmp/mlxcel-shim/mlxcel/engine && ln -sfn $PWD/kernels /tmp/mlxcel-shim/mlxcel/kernels
here=docs/benchmark_results/h200-runs-2026-12-01/run09-host-probe
export PYTHONPATH=/tmp/site:/tmp/mlxcel-shim:$PWD:$PWD/tests:$PWD/benchmarks:$here PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
export MLX_PTX_CACHE_DIR=/tmp/ptx
echo "installed at $SECONDS s"
timeout 60 python3 $here/op_costs.py > $OUT/op_costs.json 2>&1; echo "ops exit $? at $SECONDS s"; cat $OUT/op_costs.json
MLX_USE_CUDA_GRAPHS=0 timeout 60 python3 $here/op_costs.py > $OUT/op_costs_nographs.json 2>&1; echo "ops exit $? at $SECONDS s"
cat $OUT/op_costs_nographs.json
MLX_MAX_MB_PER_BUFFER=1000000 timeout 120 python3 $here/host_probe.py cut-mb > $OUT/probe-cut-mb.log 2>&1
echo "cut-mb exit $? at $SECONDS s"; grep "^cut" $OUT/probe-cut-mb.log
