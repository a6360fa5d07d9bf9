# Run 97: main (gate/up on TMA since run 89's reads) re-read at issue 26's end-to-end cell: 32 x 32K, bf16 and
# int8 pages, cascade and flat, ABBA in one process; two processes back to back. Device calls: carry .whl-b
# .whl-lm after a call that copied .whl-a into /tmp/w. Output: e2e-1/, e2e-2/.
set -u
source benchmarks/device_env.sh || exit 1
for read in 1 2; do
  out=$OUT/e2e-$read; mkdir -p $out
  timeout $((285 * read - SECONDS)) python3 benchmarks/gpu_e2e_bench.py --out /tmp/e2e32-$read --shared 32768 \
    --kv-dtypes bfloat16,int8 --skip-mlx-lm > $out/e2e.log 2>&1
  echo "e2e $read exit $? at $SECONDS s"
  cp /tmp/e2e32-$read/e2e_bench.json /tmp/e2e32-$read/e2e_bench.md $out/ 2>/dev/null; grep "^| " $out/e2e_bench.md
done
