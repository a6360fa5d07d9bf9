# Run 69: main as it stands, on an H200. `run.sh e2e8k`: install, issue 18's cell (32 x 8K: cascade, flat ABBA,
# mlx-lm) and issue 26's kernel bench (8192 x 32, KV-dtype arms); `run.sh e2e32k` on the same warm machine:
# issue 26's 32 x 32K cell (bf16 and int8 pages, cascade and flat, ABBA in one process).
# Device calls: carry .whl-b .whl-lm after a call that copied .whl-a into /tmp/w.
set -u
if ! PYTHONPATH=/tmp/site python3 -c "import mlx.core, mlx_lm" 2>/dev/null; then
  cp .whl-b/* /tmp/w/ && cat /tmp/w/part.* > /tmp/w/mlx_cuda_13-0.32.4-py3-none-manylinux_2_35_x86_64.whl && rm /tmp/w/part.*
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site /tmp/w/*.whl .whl-lm/*.whl || exit 1
fi
mkdir -p /tmp/mlxcel-shim/mlxcel && ln -sfn $PWD/engine /tmp/mlxcel-shim/mlxcel/engine && ln -sfn $PWD/kernels /tmp/mlxcel-shim/mlxcel/kernels
export PYTHONPATH=/tmp/site:/tmp/mlxcel-shim:$PWD:$PWD/tests:$PWD/benchmarks PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
export MLX_PTX_CACHE_DIR=/tmp/ptx
echo "installed at $SECONDS s"; nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
if [ "$1" = e2e8k ]; then
  timeout 330 python3 benchmarks/gpu_e2e_bench.py --out /tmp/e2e > $OUT/e2e.log 2>&1
  echo "e2e exit $? at $SECONDS s"; cp /tmp/e2e/e2e_bench.json /tmp/e2e/e2e_bench.md $OUT/ 2>/dev/null
  grep "^| " $OUT/e2e_bench.md; grep -A3 '"cascade_vs_flat_tokens"\|"flat_vs_mlx_lm_tokens"' $OUT/e2e_bench.json | head -12
  MLXCEL_KERNELS=fused timeout $((585 - SECONDS)) python3 benchmarks/gpu_attention_bench.py --out /tmp/att \
    --kv-dtypes-only --reps 10 --copy-mib 256 --matmul-n 4096 > $OUT/attention.log 2>&1
  echo "attention exit $? at $SECONDS s"; cp /tmp/att/attention_bench.json /tmp/att/attention_bench.md $OUT/ 2>/dev/null
  tail -16 $OUT/attention_bench.md 2>/dev/null
else
  ( while sleep 5; do nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits; done ) > $OUT/memory.log 2>&1 &
  timeout 560 python3 benchmarks/gpu_e2e_bench.py --out /tmp/e2e32 --shared 32768 --kv-dtypes bfloat16,int8 \
    --skip-mlx-lm > $OUT/e2e32.log 2>&1; echo "e2e exit $? at $SECONDS s"
  cp /tmp/e2e32/e2e_bench.json $OUT/e2e32_bench.json; cp /tmp/e2e32/e2e_bench.md $OUT/e2e32_bench.md
  grep "^| " $OUT/e2e32_bench.md; tail -3 $OUT/e2e32.log | cut -c1-300
  echo "GPU memory used, MiB: max $(sort -n $OUT/memory.log | tail -1)"
fi
