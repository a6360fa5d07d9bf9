# Run 112: the skinny matmul on weights tiled so a block's chunk is one run of memory (tiled_weight) against the
# row-major weights. The code it runs is commit e23c524 (its TILED launch, tiled_weight and --tiled bench arm were
# reverted after `tiled`: within 1.6% of the row-major weights on an H100, out/); `e2e` was not run. Device calls: carry .whl-b .whl-lm after a call that copied .whl-a into /tmp/w; each mode
# one call, on one warm machine.
#   run.sh tiled  kernel level, the four 8B shapes at 32 rows, two reads (CUPTI, weights cycled past the L2)
#                 -> tiled-N/matmul.{json,md}
#   run.sh e2e    issue 18's cell (32 x 8K, cascade and flat ABBA), three processes: main; the skinny kernel
#                 in every decode step (MLXCEL_MATMUL=skinny); that on tiled weights (MLXCEL_TILED_WEIGHTS=on)
#                 -> e2e-{main,skinny,tiled}/
set -u
source benchmarks/device_env.sh || exit 1
case $1 in
tiled)
  for n in 1 2; do
    out=$OUT/tiled-$n; mkdir -p $out
    timeout 200 python3 benchmarks/gpu_matmul_bench.py --out $out --rows 32 --tiled > $out/bench.log 2>&1
    echo "tiled $n exit $? at $SECONDS s"; grep "^| " $out/matmul.md
  done ;;
e2e)
  for arm in main skinny tiled; do
    out=$OUT/e2e-$arm; mkdir -p $out
    case $arm in main) env="";; skinny) env="MLXCEL_MATMUL=skinny";;
      tiled) env="MLXCEL_MATMUL=skinny MLXCEL_TILED_WEIGHTS=on";; esac
    env $env timeout 180 python3 benchmarks/gpu_e2e_bench.py --out /tmp/e2e-$arm --skip-mlx-lm > $out/e2e.log 2>&1
    echo "e2e $arm exit $? at $SECONDS s"; cp /tmp/e2e-$arm/e2e_bench.json /tmp/e2e-$arm/e2e_bench.md $out/ 2>/dev/null
    grep "^| " $out/e2e_bench.md | head -8
  done ;;
esac
