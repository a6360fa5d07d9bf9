# Run 119: quantized pages' partial kernel with its products transposed for a block of at most 8 query heads
# (HEADS_ON_N: S^T = K Q^T, O^T = V^T P^T; the heads an n8 tile's columns, not 4 of an m16 tile's 16 rows),
# against main's (51b85f4), and the verdict cells read on the branch. Made here first (not kept):
#   git show 51b85f4:kernels/cuda.py > $D/main_cuda.py   (check, ab)
# Device calls: carry .whl-b .whl-lm after a call that copied .whl-a into /tmp/w.
#   run.sh check   the int8 and int4 fused-kernel and quantized-KV GPU tests under NaN poisoning -> tests/, after
#                  ab.py (main's flat partial kernels against the branch's, bf16 / int8 / int4) -> ab/
#   run.sh ab      the ab.py part alone
#   run.sh widths  run 115's widths.py on the branch: the heuristic's width and 1, 2, 4, 5, 6 even tiles a row,
#                  bf16 / int8 / int4 flat (partial and merge) at 8192 x 32 and 32768 x 32 -> widths-5/, and with
#                  int8's blocks four an SM (INT8_BLOCKS=4: more shared memory asked) -> widths-4/
#   run.sh bench   issue 26's kernel cell (8192 shared x 32, bf16 / int8 / int4, flat and cascade), main's kernels
#                  and the branch's, one process each -> bench-main/, bench-branch/
#   run.sh vscale  (made, not run) vscale.patch against this code, int8 flat side by side -> vscale/
#   run.sh kernel  issue 26's kernel cell (run 102's `kernel` mode: 8192 shared x 32, two reads) -> kernel-N/
#   run.sh kv      issue 26's end-to-end cell (run 102's `kv` mode: 32 x 32K, bf16 and int8 pages) -> kv/
# Ran on an H100 (no H200 came): check (out-h100/), then after the scale-half change ab and widths (out-h100-2/),
# then after the waves (tile_plan.wave_width) kv and bench three times (out-h100-3/kv, read-1..3/).
set -u
source benchmarks/device_env.sh || exit 1
D=docs/benchmark_results/h200-runs-2026-12-07/run119-heads-on-n
case ${1:-check} in
check|ab)
  mkdir -p $OUT/ab
  cp $D/main_cuda.py kernels/cuda_main.py
  MLXCEL_KERNELS=fused timeout 200 python3 $D/ab.py /tmp/ab > $OUT/ab/ab.log 2>&1
  echo "ab exit $? at $SECONDS s"; cp /tmp/ab/* $OUT/ab/ 2>/dev/null; cat $OUT/ab/ab.md
  grep -E "int8:|int4:" $OUT/ab/ab.log; tail -3 $OUT/ab/ab.log | cut -c1-400
  rm kernels/cuda_main.py
  [ $1 = ab ] && exit
  mkdir -p $OUT/tests
  MLXCEL_POISON_OUTPUTS=nan timeout 280 python3 -m pytest -q -x tests/test_fused_kernels.py \
    tests/test_quantized_kv.py -k "int8 or int4" > $OUT/tests/pytest.txt 2>&1
  echo "tests exit $? at $SECONDS s"; tail -3 $OUT/tests/pytest.txt | cut -c1-300 ;;
widths)
  for blocks in 5 4; do
    out=$OUT/widths-$blocks; mkdir -p $out
    INT8_BLOCKS=$blocks MLXCEL_KERNELS=fused timeout 250 python3 $D/widths.py /tmp/widths$blocks > $out/widths.log 2>&1
    echo "widths $blocks exit $? at $SECONDS s"; cp /tmp/widths$blocks/* $out/ 2>/dev/null; cat $out/widths.md
    tail -2 $out/widths.log | cut -c1-400
  done ;;
bench)
  # main's kernels (main_kernels/, made here: git archive 51b85f4 kernels | tar -x -C $D/main_kernels
  # --strip-components=1; not kept) and the branch's behind the package's shim, one bench process each.
  for arm in main branch; do
    src=$PWD/kernels; [ $arm = main ] && src=$PWD/$D/main_kernels
    ln -sfn $src /tmp/mlxcel-shim/mlxcel/kernels
    out=$OUT/bench-$arm; mkdir -p $out
    MLXCEL_KERNELS=fused timeout 170 python3 benchmarks/gpu_attention_bench.py --out /tmp/att-$arm --kv-dtypes-only \
      --reps 10 --copy-mib 256 --matmul-n 4096 > $out/att.log 2>&1
    echo "bench $arm exit $? at $SECONDS s"
    cp /tmp/att-$arm/attention_bench.json /tmp/att-$arm/attention_bench.md $out/ 2>/dev/null
    grep -E "^\| (bf16|int8|int4)" $out/attention_bench.md
  done
  ln -sfn $PWD/kernels /tmp/mlxcel-shim/mlxcel/kernels ;;
vscale)
  # Made, not run: vscale.patch (int8's value scales on the weights in the transposed step, the codes exact to the
  # mma: no HMUL2 on the values; 94 registers) against this code in one process (run 118's variants.py).
  mkdir -p $OUT/vscale; cp kernels/cuda.py kernels/cuda_main.py
  patch -s -o kernels/cuda_vscale.py kernels/cuda.py $D/vscale.patch || exit 1
  MLXCEL_KERNELS=fused timeout 300 python3 docs/benchmark_results/h200-runs-2026-12-07/run118-conversions/variants.py \
    /tmp/vscale vscale=cuda_vscale > $OUT/vscale/variants.log 2>&1
  echo "vscale exit $? at $SECONDS s"; cp /tmp/vscale/* $OUT/vscale/ 2>/dev/null; cat $OUT/vscale/variants.md
  grep "difference" $OUT/vscale/variants.log; rm kernels/cuda_main.py kernels/cuda_vscale.py ;;
kernel|kv)
  bash docs/benchmark_results/h200-runs-2026-12-06/run102-h200-read/run.sh $1 ;;
esac
