# split_n_matmul (warps splitting N over one shared x stage): its GPU tests against float64, probe.py (gate/up
# on it against main's looping launch, A B C C B A in one process), then the matmul bench's sweep of it at 32
# rows. Device call: carry .whl-b .whl-lm after a call that copied .whl-a into /tmp/w.
set -u
if ! PYTHONPATH=/tmp/site python3 -c "import mlx.core, mlx_lm" 2>/dev/null; then
  cp .whl-b/* /tmp/w/ && cat /tmp/w/part.* > /tmp/w/mlx_cuda_13-0.32.4-py3-none-manylinux_2_35_x86_64.whl && rm /tmp/w/part.*
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site /tmp/w/*.whl .whl-lm/*.whl || exit 1
fi
mkdir -p /tmp/mlxcel-shim/mlxcel && ln -sfn $PWD/engine /tmp/mlxcel-shim/mlxcel/engine && ln -sfn $PWD/kernels /tmp/mlxcel-shim/mlxcel/kernels
export PYTHONPATH=/tmp/site:/tmp/mlxcel-shim:$PWD:$PWD/tests:$PWD/benchmarks PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
export MLX_PTX_CACHE_DIR=/tmp/ptx
D=docs/benchmark_results/h200-runs-2026-12-03/run54-split-n
echo "installed at $SECONDS s"
timeout 80 python3 -m pytest -q -p no:cacheprovider -rf tests/test_cuda_matmul.py -k "splitting" > $OUT/tests.log 2>&1
echo "tests exit $? at $SECONDS s"; grep -E "^FAILED|^ERROR|passed|failed|Error|assert" $OUT/tests.log | head -8
timeout 190 python3 $D/probe.py /tmp/probe > $OUT/probe.log 2>&1
echo "probe exit $? at $SECONDS s"; cp /tmp/probe/* $OUT/ 2>/dev/null; cat $OUT/probe.md; tail -2 $OUT/probe.log
timeout $((330 - SECONDS)) python3 benchmarks/gpu_matmul_bench.py --out /tmp/mm --rows 32 --sweep \
  --sweep-tiles s2x4x6 s2x4x8 s1x4x8 s2x8x4 s1x2x8 > $OUT/matmul.log 2>&1
echo "bench exit $? at $SECONDS s"; cp /tmp/mm/matmul.* $OUT/ 2>/dev/null
grep '"arm"' $OUT/matmul.log | python3 -c "import sys,json; [print(r['shape'], r['arm'], round(r['gpu_us'],2), round(r['tb_s'],2)) for r in map(json.loads, sys.stdin)]"
