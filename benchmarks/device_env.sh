# The device machine's environment for a run script, sourced from the repository root:
#   source benchmarks/device_env.sh
# Installs MLX's CUDA wheels and mlx-lm into /tmp/site unless they already import (a call that carried
# .whl-a copied it into /tmp/w first; this call carries .whl-b and .whl-lm), links the package's shim,
# and exports PYTHONPATH (/tmp/site, the shim, the repository, tests/ and benchmarks/) and MLX's PTX cache.
if ! PYTHONPATH=/tmp/site python3 -c "import mlx.core, mlx_lm" 2>/dev/null; then
  cp .whl-b/* /tmp/w/ && cat /tmp/w/part.* > /tmp/w/mlx_cuda_13-0.32.4-py3-none-manylinux_2_35_x86_64.whl \
    && rm /tmp/w/part.* || return 1
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site /tmp/w/*.whl .whl-lm/*.whl || return 1
fi
mkdir -p /tmp/mlxcel-shim/mlxcel && ln -sfn "$PWD/engine" /tmp/mlxcel-shim/mlxcel/engine \
  && ln -sfn "$PWD/kernels" /tmp/mlxcel-shim/mlxcel/kernels
export PYTHONPATH=/tmp/site:/tmp/mlxcel-shim:$PWD:$PWD/tests:$PWD/benchmarks PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
export MLX_PTX_CACHE_DIR=/tmp/ptx
echo "installed at $SECONDS s"; nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
