# Issue 26 on main as it stands (the gather path's prefill off cuDNN): `run.sh kernel` installs and reads the kernel
# bench's KV-dtype arms (8192 x 32); `run.sh e2e`, on the same warm machine, the 32 x 32K cell (bf16 vs int8 pages,
# cascade and flat, ABBA in one process). Device calls: carry .whl-b .whl-lm after a call that copied .whl-a into
# /tmp/w.
set -u
if ! PYTHONPATH=/tmp/site python3 -c "import mlx.core, mlx_lm" 2>/dev/null; then
  cp .whl-b/* /tmp/w/ && cat /tmp/w/part.* > /tmp/w/mlx_cuda_13-0.32.4-py3-none-manylinux_2_35_x86_64.whl && rm /tmp/w/part.*
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site /tmp/w/*.whl .whl-lm/*.whl || exit 1
fi
mkdir -p /tmp/mlxcel-shim/mlxcel && ln -sfn $PWD/engine /tmp/mlxcel-shim/mlxcel/engine && ln -sfn $PWD/kernels /tmp/mlxcel-shim/mlxcel/kernels
export PYTHONPATH=/tmp/site:/tmp/mlxcel-shim:$PWD:$PWD/tests:$PWD/benchmarks PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
export MLX_PTX_CACHE_DIR=/tmp/ptx
echo "installed at $SECONDS s"; nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
if [ "$1" = kernel ]; then
  MLXCEL_KERNELS=fused timeout 240 python3 benchmarks/gpu_attention_bench.py --out /tmp/att --kv-dtypes-only --reps 10 \
    --copy-mib 256 --matmul-n 4096 > $OUT/attention.log 2>&1
  echo "attention exit $? at $SECONDS s"; cp /tmp/att/attention_bench.json /tmp/att/attention_bench.md $OUT/ 2>/dev/null
  tail -16 $OUT/attention_bench.md 2>/dev/null
else
  ( while sleep 5; do nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits; done ) > $OUT/memory.log 2>&1 &
  timeout 540 python3 benchmarks/gpu_e2e_bench.py --out /tmp/e2e32 --shared 32768 --kv-dtypes bfloat16,int8 \
    --skip-mlx-lm > $OUT/e2e.log 2>&1; echo "e2e exit $? at $SECONDS s"
  cp /tmp/e2e32/e2e_bench.json /tmp/e2e32/e2e_bench.md $OUT/; grep "^| " $OUT/e2e_bench.md
  grep -A2 '"cascade_vs_flat_tokens"' $OUT/e2e_bench.json | head -4; tail -3 $OUT/e2e.log | cut -c1-300
  echo "GPU memory used, MiB: max $(sort -n $OUT/memory.log | tail -1)"
fi
