# The whole-line copies of run 33 with the copies' addresses taken once (32-bit row offsets, a liveness mask):
# the matmul bench against cuBLAS at 32 rows first; only if gate/up beats run 25's 63.7 us, the skinny kernel's
# float64 GPU tests and the e2e bench. Device call: carry .whl-b .whl-lm after a call that copied .whl-a into /tmp/w.
# The kernel as of commit dfde676 (reverted after runs 33-34).
set -u
if ! PYTHONPATH=/tmp/site python3 -c "import mlx.core, mlx_lm" 2>/dev/null; then
  cp .whl-b/* /tmp/w/ && cat /tmp/w/part.* > /tmp/w/mlx_cuda_13-0.32.4-py3-none-manylinux_2_35_x86_64.whl && rm /tmp/w/part.*
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site /tmp/w/*.whl .whl-lm/*.whl || exit 1
fi
mkdir -p /tmp/mlxcel-shim/mlxcel && ln -sfn $PWD/engine /tmp/mlxcel-shim/mlxcel/engine && ln -sfn $PWD/kernels /tmp/mlxcel-shim/mlxcel/kernels
export PYTHONPATH=/tmp/site:/tmp/mlxcel-shim:$PWD:$PWD/tests:$PWD/benchmarks PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
export MLX_PTX_CACHE_DIR=/tmp/ptx
echo "installed at $SECONDS s"
timeout 60 python3 benchmarks/gpu_matmul_bench.py --out /tmp/matmul --rows 32 > $OUT/matmul.log 2>&1
echo "matmul exit $? at $SECONDS s"; cp /tmp/matmul/matmul.md $OUT/ 2>/dev/null; cat $OUT/matmul.md
python3 -c "
import json, sys; rows = json.load(open('/tmp/matmul/matmul.json'))
r = next(r for r in (rows if isinstance(rows, list) else rows['results']) if r['shape'] == 'gate_up' and 'skinny' in r['arm'])
sys.exit(0 if r['gpu_us'] < 62.0 else 1)" || { echo "gate/up not faster: stop"; exit 0; }
MLXCEL_KERNELS=fused timeout 130 python3 -m pytest -q -p no:cacheprovider -rf tests/test_cuda_matmul.py \
  -k "swiglu_of or norm_on_the or residual_add or every_launch_shape or products_match" \
  --deselect tests/test_cuda_matmul.py::test_the_kernel_compiles_without_spills_in_its_shared_memory > $OUT/tests.log 2>&1
echo "kernel tests exit $? at $SECONDS s"; grep -E "^FAILED|^ERROR|passed|failed" $OUT/tests.log | tail -6
timeout 220 python3 benchmarks/gpu_e2e_bench.py --out /tmp/e2e > $OUT/e2e.log 2>&1; echo "e2e exit $? at $SECONDS s"
cp /tmp/e2e/e2e_bench.json /tmp/e2e/e2e_bench.md $OUT/ 2>/dev/null; grep "^| " $OUT/e2e_bench.md
grep -A4 '"cascade_vs_flat_tokens"\|"flat_vs_mlx_lm_tokens"' $OUT/e2e_bench.json | head -14; tail -2 $OUT/e2e.log
