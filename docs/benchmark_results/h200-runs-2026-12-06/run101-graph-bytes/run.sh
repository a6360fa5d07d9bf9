# Run 101: MLX's CUDA graph byte bound (MLX_MAX_MB_PER_BUFFER, 1000 MB on Hopper) against a server-sized pool.
# MLX counts each kernel's inputs, a layer's whole K and V pool at every attention launch among them, so with
# a pool of 5,000 pages (23.6 GB, K and V 0.66 GB a layer) every attention launch ends a graph. Issue 18's cell (32 x
# 8K, cascade and flat ABBA, no mlx-lm) in one process a setting, the setting being process-wide:
#   run.sh pool      --pool-pages 5000: MLX's bound, then MLX_MAX_MB_PER_BUFFER=1000000 -> pool-default/, pool-lifted/
#   run.sh cell      the bench's own pool (512 pages): the same two -> cell-default/, cell-lifted/
#   run.sh widened   --pool-pages 5000 with the bound the serve command now sets (graph_bound: 1000 + six layer
#                    pools' MB, the bench's default), then MLX's 1000 named -> widened-engine/, widened-mlx/
# Device calls: carry .whl-b .whl-lm after a call that copied .whl-a into /tmp/w.
set -u
source benchmarks/device_env.sh || exit 1
pages=0; [ "$1" = pool ] && pages=5000
if [ "$1" = widened ]; then
  for limit in engine mlx; do
    out=$OUT/widened-$limit; mkdir -p $out
    if [ $limit = mlx ]; then export MLX_MAX_MB_PER_BUFFER=1000; else unset MLX_MAX_MB_PER_BUFFER; fi
    timeout 130 python3 benchmarks/gpu_e2e_bench.py --out /tmp/e2e-w-$limit --skip-mlx-lm --pool-pages 5000 \
      > $out/e2e.log 2>&1
    echo "widened $limit exit $? at $SECONDS s"
    cp /tmp/e2e-w-$limit/e2e_bench.json /tmp/e2e-w-$limit/e2e_bench.md $out/ 2>/dev/null
    grep "^| \|MLX_MAX" $out/e2e_bench.md; grep -o '"mlx_graph_limits": {[^}]*}' $out/e2e_bench.json
  done
  exit
fi
for limit in default lifted; do
  out=$OUT/$1-$limit; mkdir -p $out
  if [ $limit = lifted ]; then export MLX_MAX_MB_PER_BUFFER=1000000; else unset MLX_MAX_MB_PER_BUFFER; fi
  timeout 270 python3 benchmarks/gpu_e2e_bench.py --out /tmp/e2e-$1-$limit --skip-mlx-lm --pool-pages $pages \
    > $out/e2e.log 2>&1
  echo "$1 $limit exit $? at $SECONDS s"
  cp /tmp/e2e-$1-$limit/e2e_bench.json /tmp/e2e-$1-$limit/e2e_bench.md $out/ 2>/dev/null
  grep "^| " $out/e2e_bench.md
done
