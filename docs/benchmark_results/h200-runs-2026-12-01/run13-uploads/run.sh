# What a small host-to-device array costs the host (upload_probe.py). Device call: carry .whl-b .whl-lm after .whl-a.
set -u
cp .whl-b/* /tmp/w/ && cat /tmp/w/part.* > /tmp/w/mlx_cuda_13-0.32.4-py3-none-manylinux_2_35_x86_64.whl && rm /tmp/w/part.*
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site /tmp/w/*.whl .whl-lm/*.whl || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 MLX_PTX_CACHE_DIR=/tmp/ptx
timeout 120 python3 docs/benchmark_results/h200-runs-2026-12-01/run13-uploads/upload_probe.py 2>&1 | tee $OUT/upload_probe.log
