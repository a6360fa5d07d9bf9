# The e2e read of issue 18's cell on main (cascade, flat, mlx-lm), then the same bench with every projection of
# the cascade steps on producer_matmul (cuda_matmul.PRODUCER), mlx-lm skipped. Same warm machine as run 55.
set -u
mkdir -p /tmp/mlxcel-shim/mlxcel && ln -sfn $PWD/engine /tmp/mlxcel-shim/mlxcel/engine && ln -sfn $PWD/kernels /tmp/mlxcel-shim/mlxcel/kernels
export PYTHONPATH=/tmp/site:/tmp/mlxcel-shim:$PWD:$PWD/tests:$PWD/benchmarks PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
export MLX_PTX_CACHE_DIR=/tmp/ptx
timeout 250 python3 benchmarks/gpu_e2e_bench.py --out /tmp/e2e > $OUT/e2e.log 2>&1
echo "e2e exit $? at $SECONDS s"; cp /tmp/e2e/e2e_bench.json $OUT/e2e_bench.json; cp /tmp/e2e/e2e_bench.md $OUT/e2e_bench.md
grep "^| " $OUT/e2e_bench.md; grep -A2 '"cascade_vs_flat_tokens"\|"flat_vs_mlx_lm_tokens"' $OUT/e2e_bench.json | head -8
timeout $((530 - SECONDS)) python3 -c "
import runpy, sys
from mlxcel.kernels import cuda_matmul
cuda_matmul.PRODUCER = True
sys.argv = ['gpu_e2e_bench.py', '--out', '/tmp/e2e_p', '--skip-mlx-lm']
runpy.run_path('benchmarks/gpu_e2e_bench.py', run_name='__main__')" > $OUT/e2e_producer.log 2>&1
echo "e2e producer exit $? at $SECONDS s"; cp /tmp/e2e_p/e2e_bench.json $OUT/e2e_producer.json
cp /tmp/e2e_p/e2e_bench.md $OUT/e2e_producer.md; grep "^| " $OUT/e2e_producer.md
grep -A2 '"cascade_vs_flat_tokens"' $OUT/e2e_producer.json | head -4; tail -3 $OUT/e2e_producer.log | cut -c1-300
