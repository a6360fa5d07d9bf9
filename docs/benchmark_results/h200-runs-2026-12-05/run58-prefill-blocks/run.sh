# A 32K prompt's prefill on an H100 (one NVIDIA H100 80GB HBM3). This script ran probe.py (blocks of query tokens
# through mx.fast.scaled_dot_product_attention, i.e. cuDNN: out of memory, out/probe_blocks_cudnn.log); then, on the
# same warm machine, steps.py (memory after each prefill step): as it was (out/steps_cudnn.log), with
# MLX_MAX_OPS_PER_BUFFER=10 or MLX_MAX_MB_PER_BUFFER=200 (steps_cudnn_graph_limits.log), with
# MLX_CUDA_USE_CUDNN_SDPA=0 (and its misspelt twin MLX_CUDA_USE_CUDNN_SPDA=0: steps_nocudnn.log), and on main's
# masked_attention (steps_main.log, steps_main2.log, steps_main_nocudnn.log; steps_sdpa_nocudnn.log: MLX's SDPA in its
# place, cuDNN off). Each process draws its own random weights, so tokens compare only within one.
# Device call: carry .whl-b .whl-lm after a call that copied .whl-a.
set -u
if ! PYTHONPATH=/tmp/site python3 -c "import mlx.core, mlx_lm" 2>/dev/null; then
  cp .whl-b/* /tmp/w/ && cat /tmp/w/part.* > /tmp/w/mlx_cuda_13-0.32.4-py3-none-manylinux_2_35_x86_64.whl && rm /tmp/w/part.*
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site /tmp/w/*.whl .whl-lm/*.whl || exit 1
fi
mkdir -p /tmp/mlxcel-shim/mlxcel && ln -sfn $PWD/engine /tmp/mlxcel-shim/mlxcel/engine && ln -sfn $PWD/kernels /tmp/mlxcel-shim/mlxcel/kernels
export PYTHONPATH=/tmp/site:/tmp/mlxcel-shim:$PWD:$PWD/tests:$PWD/benchmarks PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
export MLX_PTX_CACHE_DIR=/tmp/ptx
echo "installed at $SECONDS s"
timeout 200 python3 docs/benchmark_results/h200-runs-2026-12-05/run58-prefill-blocks/probe.py > $OUT/probe.log 2>&1
echo "probe exit $? at $SECONDS s"; grep '^{' $OUT/probe.log; grep -E "Error|error" $OUT/probe.log | head -3 | cut -c1-300
