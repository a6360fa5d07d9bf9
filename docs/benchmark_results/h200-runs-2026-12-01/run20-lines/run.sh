# The skinny matmul reading a 128-byte line of each weight row a chunk (four lanes 64 contiguous bytes, twice)
# against cuBLAS, with a sweep at
# 32 rows, after the kernel's GPU tests. Device call: carry .whl-b .whl-lm after a call that copied .whl-a into /tmp/w.
set -u
if ! PYTHONPATH=/tmp/site python3 -c "import mlx.core, mlx_lm" 2>/dev/null; then
  cp .whl-b/* /tmp/w/ && cat /tmp/w/part.* > /tmp/w/mlx_cuda_13-0.32.4-py3-none-manylinux_2_35_x86_64.whl && rm /tmp/w/part.*
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site /tmp/w/*.whl .whl-lm/*.whl || exit 1
fi
mkdir -p /tmp/mlxcel-shim/mlxcel && ln -sfn $PWD/engine /tmp/mlxcel-shim/mlxcel/engine && ln -sfn $PWD/kernels /tmp/mlxcel-shim/mlxcel/kernels
export PYTHONPATH=/tmp/site:/tmp/mlxcel-shim:$PWD:$PWD/tests:$PWD/benchmarks PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
export MLX_PTX_CACHE_DIR=/tmp/ptx
echo "installed at $SECONDS s"
timeout 100 python3 -m pytest -q -p no:cacheprovider -rf tests/test_cuda_matmul.py > $OUT/tests.log 2>&1
echo "tests exit $? at $SECONDS s"; grep -E "^FAILED|^ERROR|passed|failed" $OUT/tests.log | tail -6
timeout 300 python3 benchmarks/gpu_matmul_bench.py --out $OUT --sweep > $OUT/matmul.log 2>&1
echo "bench exit $? at $SECONDS s"
python3 - $OUT/matmul.json <<'PY'
import json, sys, collections
best = collections.defaultdict(dict)
for r in json.load(open(sys.argv[1]))["results"]:
    key, kind = (r["shape"], r["rows"]), "mlx" if r["arm"] == "mlx" else "picked" if r["picked"] else "other"
    if kind != "other" or r["gpu_us"] < best[key].get("other", (1e9,))[0]:
        best[key][kind] = (r["gpu_us"], r["arm"], r["encode_us"])
for key, v in best.items():
    print(key, {k: (round(g, 1), a, round(e, 1)) for k, (g, a, e) in v.items()})
PY
